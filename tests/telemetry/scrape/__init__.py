"""Tests of pdtop/telemetry/scrape."""
