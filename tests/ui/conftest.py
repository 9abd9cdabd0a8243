"""Fixtures for the dashboard tests: a real sim engine served on loopback, real recordings.

`EngineServer` runs the telemetry server on its own event loop thread and, unless
`manual=True`, the engine's round loop on another thread (paced to wall time), the
way `pdtop serve` does. Tests then drive the app with `App.run_test` / Pilot.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from pdtop.engine.engine import build_engine
from pdtop.engine.records import ConfigChange
from pdtop.engine.workload import WorkloadSpec
from pdtop.telemetry import events as ev
from pdtop.telemetry.recorder import Recorder
from pdtop.telemetry.server import TelemetryServer

TOKEN = "test-token"


def sim_engine(rate: float = 8.0, seed: int = 0) -> Any:
    return build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=rate, seed=seed),
                        seed=seed)


class EngineServer:
    """A sim engine behind a `TelemetryServer` on 127.0.0.1; the server can be stopped and restarted."""

    def __init__(self, engine: Any, token: str | None = TOKEN, manual: bool = False, **server_options: Any) -> None:
        self.engine, self.token, self.manual = engine, token, manual
        self.server_options = server_options
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self._loop_thread.start()
        self._stop = threading.Event()
        self._engine_thread: threading.Thread | None = None
        self.server: TelemetryServer | None = None
        self.port = 0

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def start_server(self, port: int | None = None) -> str:
        server = TelemetryServer(self.engine, "127.0.0.1", self.port if port is None else port, token=self.token,
                                 **self.server_options)
        self._call(server.start())
        self.server, self.port = server, server.port
        return self.url

    def stop_server(self) -> None:
        if self.server is not None:
            self._call(self.server.stop())  # also detaches it from the engine
            self.server = None

    def start(self) -> "EngineServer":
        self.start_server(0)
        if not self.manual:
            self._engine_thread = threading.Thread(target=self.engine.run, args=(self._stop,), name="test-engine",
                                                   daemon=True)
            self._engine_thread.start()
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        if self._engine_thread is not None:
            self._engine_thread.join(timeout=10)
        self.stop_server()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        self.engine.close()


@pytest.fixture
def served():
    """A running sim engine (rate 8 req/s) served with the control token `TOKEN`."""
    es = EngineServer(sim_engine()).start()
    yield es
    es.close()


def record_engine(path: Path, rounds: int, rate: float = 8.0,
                  controls: dict[int, dict[str, Any]] | None = None) -> Path:
    """Step a sim engine `rounds` times and write what it reports as a recording.

    Times are the engine's virtual clock, so the file is the same on every run.
    `controls` maps a round number to a control message applied before it.
    """
    engine = sim_engine(rate=rate)
    hello = ev.hello_event("recorder", True, engine.describe())
    rec = Recorder(path, hello)
    t0 = engine.device.now()
    last = [0.0]

    def sink(record: Any) -> None:
        config = engine.config_dict() if isinstance(record, ConfigChange) else None
        last[0] = max(last[0], record.time - t0)  # a file's times never go back
        rec.write(ev.encode(ev.record_event(record, config)), t=last[0])

    engine.add_sink(sink)
    controls = dict(controls or {})
    for i in range(rounds):
        if i in controls:
            engine.control(controls[i])
        engine.step()
    rec.close()
    engine.close()
    return path


@pytest.fixture(scope="session")
def recording(tmp_path_factory) -> Path:
    """3000 rounds (about 19 s) of a sim H100 at 12 requests/s, decode_bs_divisor 12 from round 1200,
    and a 32k-token prompt injected near the end (still in prefill when the file ends)."""
    path = tmp_path_factory.mktemp("rec") / "sim-h100.ndjson"
    return record_engine(path, 3000, rate=12.0, controls={
        1200: {"cmd": "set", "decode_bs_divisor": 12},
        2990: {"cmd": "inject", "prompt_tokens": 32768},
    })


async def until(pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 15.0,
                poll: float = 0.05) -> None:
    """Let the app run until `predicate()` holds; fail with `what` if it never does."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        if poll:
            await pilot.pause(poll)
        else:
            await asyncio.sleep(0.001)
