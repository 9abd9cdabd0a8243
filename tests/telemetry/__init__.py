"""Telemetry tests, mirroring pdtop/telemetry (a package, so its conftest does not shadow other
directories' `conftest` modules)."""
