"""Tests of pdtop/telemetry/recording."""
