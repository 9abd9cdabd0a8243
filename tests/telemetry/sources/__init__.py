"""Tests of pdtop/telemetry/sources."""
