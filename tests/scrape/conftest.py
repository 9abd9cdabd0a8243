"""Loopback servers with vLLM's and SGLang's metrics, and a helper that reads a source's events."""
from __future__ import annotations

import asyncio
import time

import pytest

from .servers import PageServer, SglangMetrics, VllmMetrics


@pytest.fixture
def vllm():
    """vLLM's metrics for one model, served at `vllm.server.url`."""
    metrics = VllmMetrics()
    metrics.server = PageServer(metrics.registry)
    yield metrics
    metrics.server.close()


@pytest.fixture
def sglang():
    metrics = SglangMetrics()
    metrics.server = PageServer(metrics.registry)
    yield metrics
    metrics.server.close()


async def next_of(events, kind: str, timeout: float = 10.0) -> dict:
    """The next event of type `kind` from an events() iterator (others are passed over)."""
    async def find() -> dict:
        async for event in events:
            if event["type"] == kind:
                return event
        raise AssertionError(f"the source ended before a {kind!r} event")

    return await asyncio.wait_for(find(), timeout)


async def until_shown(pilot, predicate, what: str, timeout: float = 15.0) -> None:
    """Let a Pilot-driven app run until `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await pilot.pause(0.05)


def shown(app, panel: str) -> str:
    """What a panel of the app shows now, as plain text."""
    app.repaint()
    return "\n".join(t.plain for t in app.query_one(panel)._last_texts)


def header_text(app) -> str:
    app.repaint()
    return app.query_one("HeaderBar").text
