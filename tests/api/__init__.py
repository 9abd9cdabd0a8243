"""HTTP API tests (a package, so its conftest does not shadow other directories' `conftest` modules)."""
