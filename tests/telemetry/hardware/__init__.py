"""Tests of pdtop/telemetry/hardware."""
