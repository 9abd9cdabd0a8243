"""Fixtures for the telemetry tests (server/, recording/, hardware/, scrape/, sources/ below): a real
simulated-GPU engine, a real server on loopback, a raw websocket client that records every frame it gets,
and loopback servers with vLLM's and SGLang's metrics with a helper that reads a source's events."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
from websockets.asyncio.client import connect

from pdtop.engine.build import build_engine
from pdtop.engine.records import ConfigChange
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry import encode
from pdtop.telemetry.events import ConfigEvent, Hello
from pdtop.telemetry.server.server import TelemetryServer


def make_engine(rate: float = 50.0):
    return build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=rate, seed=1))


def hello_event(client_id: str = "recorder", readonly: bool = True) -> dict:
    """The hello a real engine (a fresh sim H100) gets from the server."""
    eng = make_engine()
    try:
        return encode.wire(Hello(client_id=client_id, readonly=readonly, engine=eng.describe()))
    finally:
        eng.close()


def config_event(time: float, round_index: int, **settings) -> dict:
    """A `config` event setting `settings` in a real engine's configuration."""
    eng = make_engine()
    try:
        old = eng.config_record()
    finally:
        eng.close()
    change = ConfigChange(time, round_index, {k: {"old": encode.plain(getattr(old, k)), "new": v}
                                              for k, v in settings.items()})
    return json.loads(encode.encode(ConfigEvent.after(change, dataclasses.replace(old, **settings))))


@pytest.fixture
def engine():
    eng = make_engine()
    yield eng
    eng.close()


async def steps(engine, n: int) -> None:
    """Run `n` rounds on a worker thread (the engine's own thread in real use)."""
    await asyncio.to_thread(lambda: [engine.step() for _ in range(n)])


async def stepping(engine, awaitable, timeout: float = 5.0):
    """Await `awaitable` (a control command's reply, which waits for a round boundary) while the engine
    runs rounds, one at a time."""
    task = asyncio.ensure_future(awaitable)

    async def step():
        while not task.done():
            await steps(engine, 1)
            await asyncio.sleep(0.002)

    await asyncio.wait_for(step(), timeout)
    return await task


async def queued(engine, n: int, timeout: float = 5.0) -> None:
    """Wait until `n` control commands wait in the engine for its next round boundary."""
    async def poll():
        while len(engine.controls) < n:
            await asyncio.sleep(0.002)
    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def server(engine):
    srv = TelemetryServer(engine, port=0, tick=0.01)
    await srv.start()
    yield srv
    await srv.stop()


class Raw:
    """A websocket client that keeps every frame (decoded) in `events`."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[dict] = []
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str, **kw):
        return cls(await connect(url, compression=None, max_size=2**21, **kw))

    async def _read(self):
        async for frame in self.ws:
            event = json.loads(frame)
            if event.get("type") == "batch":
                self.events.extend(event["events"])
            else:
                self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == kind]

    async def wait(self, pred, timeout: float = 10.0):
        """Wait until pred(self) is true (checked as frames arrive)."""
        async def poll():
            while not pred(self):
                await asyncio.sleep(0.005)
        await asyncio.wait_for(poll(), timeout)

    async def request(self, msg, timeout: float = 5.0, engine=None) -> dict:
        """Send one frame (dict -> JSON, str/bytes as is) and return the next reply. An engine command's
        reply comes once the engine has applied or refused it at a round boundary: with `engine` (stepped
        by the test), rounds are run here until the reply is in."""
        n = len(self.of("reply"))
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)
        if engine is not None:
            async def step_until_replied():
                while len(self.of("reply")) <= n:
                    await steps(engine, 1)
                    await asyncio.sleep(0.002)
            await asyncio.wait_for(step_until_replied(), timeout)
        await self.wait(lambda c: len(c.of("reply")) > n, timeout)
        return self.of("reply")[n]

    async def close(self):
        await self.ws.close()
        await self.task


class Pump:
    """Reads a source on its own task, so a test can wait on `get()` with a timeout
    (cancelling `anext` on an async generator would close it)."""

    def __init__(self, src):
        self.q: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(src))

    async def _run(self, src):
        async for e in src.events():
            await self.q.put(e)

    async def get(self, timeout=5.0):
        return await asyncio.wait_for(self.q.get(), timeout)

    async def nothing_for(self, seconds=0.3):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(self.q.get(), seconds)
        return True


@pytest.fixture
def vllm():
    """vLLM's metrics for one model, served at `vllm.server.url`."""
    from .servers import PageServer, VllmMetrics  # here, not at the top: prometheus_client only where used

    metrics = VllmMetrics()
    metrics.server = PageServer(metrics.registry)
    yield metrics
    metrics.server.close()


@pytest.fixture
def sglang():
    from .servers import PageServer, SglangMetrics

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
