"""Tests of pdtop/telemetry/server."""
