"""Fixtures for the dashboard tests: a real sim engine served on loopback, real recordings.

`EngineServer` runs the telemetry server on its own event loop thread and, unless
`manual=True`, the engine's round loop on another thread (paced to wall time), the
way `pdtop serve` does. Tests then drive the app with `App.run_test` / Pilot.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from telemetry.conftest import sglang, vllm  # noqa: F401  (the loopback metrics pages, for the attached dashboard)

from pdtop.engine.build import build_engine
from pdtop.engine.description import EngineConfig
from pdtop.engine.records import ConfigChange, PrefillProgress, RequestRecord, RoundRecord
from pdtop.engine.scheduling.commands import Inject, Set
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry.encode import encode, wire
from pdtop.telemetry.events import ConfigEvent, Hello
from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.server.commands import parse_command
from pdtop.telemetry.server.server import TelemetryServer

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

    def start(self) -> EngineServer:
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
def served(tmp_path):
    """A running sim engine (rate 8 req/s) served with the control token `served.token`;
    clients may record into `tmp_path`."""
    es = EngineServer(sim_engine(), record_dir=tmp_path).start()
    yield es
    es.close()


def record_engine(path: Path, rounds: int, rate: float = 8.0,
                  controls: dict[int, dict[str, Any]] | None = None) -> Path:
    """Step a sim engine `rounds` times and write what it reports as a recording.

    Times are the engine's virtual clock, so the file is the same on every run.
    `controls` maps a round number to a control message applied before it.
    """
    engine = sim_engine(rate=rate)
    hello = wire(Hello(client_id="recorder", readonly=True, engine=engine.describe()))
    rec = Recorder(path, hello)
    t0 = engine.device.now()
    last = [0.0]

    def sink(record: Any) -> None:
        event = ConfigEvent.after(record, engine.config_record()) if isinstance(record, ConfigChange) else record
        last[0] = max(last[0], record.time - t0)  # a file's times never go back
        rec.write(encode(event), t=last[0])

    engine.add_sink(sink)
    controls = dict(controls or {})
    for i in range(rounds):
        if i in controls:
            engine.control(parse_command(controls[i]))
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


async def _until(pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 15.0,
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


async def stepping_until(pilot: Any, engine: Any, predicate: Callable[[], Any], what: str,
                         timeout: float = 15.0) -> None:
    """Step a hand-driven engine, a round at a time, until `predicate()` holds: a control command's
    reply comes once the engine has run the round boundary that applies it."""
    def stepped() -> Any:
        engine.step()
        return predicate()

    await _until(pilot, stepped, what, timeout)


@pytest.fixture
def until() -> Callable[..., Any]:
    """`await until(pilot, predicate, what, timeout=15, poll=0.05)`: run the app until predicate() holds."""
    return _until


@pytest.fixture
def stepped():
    """A sim engine (12 req/s) that the test steps by hand, served on loopback; nothing is shed."""
    es = EngineServer(sim_engine(rate=12.0), manual=True, max_event_rate=1e9).start()
    yield es
    es.close()


@pytest.fixture
def busy():
    """A sim engine the test steps by hand, with a steady decode batch (long outputs, 6 requests/s),
    served on loopback with nothing shed; `play_busy` drives it."""
    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b",
                          workload=WorkloadSpec(rate=6.0, output_tokens=(200, 600), seed=0), seed=0)
    es = EngineServer(engine, manual=True, max_event_rate=1e9).start()
    yield es
    es.close()


async def play_busy(pilot: Any, app: Any, engine: Any) -> None:
    """About 2000 rounds with prefill budget 16384 (an 8192-token prompt advances 2 layers a round): such
    a prompt injected every 400 rounds, decode_bs_divisor 8 from round 1000, and a last one still in
    prefill at the end. Waits until the dashboard has every round."""
    await _until(pilot, lambda: app.connection == "live", "connected")
    engine.control(Set(split_forward_token_budget=16384))
    for batch in range(40):
        if batch % 8 == 3 or batch == 39:
            engine.control(Inject(8192))
        if batch == 20:
            engine.control(Set(decode_bs_divisor=8))
        for _ in range(50 if batch < 39 else 8):
            engine.step()
        target = engine.scheduler.round_index - 1
        await _until(pilot, lambda target=target: app.state.round_index >= target, f"round {target}")
    assert app.state.dropped == 0 and app.state.prefills


# ---- events as the server sends them: built from the engine's records and a real engine's hello ----

def _real_hello() -> tuple[dict, EngineConfig]:
    engine = sim_engine()
    try:
        return wire(Hello(client_id="c1", readonly=False, engine=engine.describe())), engine.config_record()
    finally:
        engine.close()


HELLO, CONFIG = _real_hello()  # a sim H100: 132 SMs, 8 levels, decode_bs_divisor 36, policy pdmux
LEVELS = HELLO["engine"]["levels"]


def _round_event(i: int, t: float, *, step: float = 0.01, bs: int = 4, prefills=(), level: int = 4,
                 bytes_moved: float = 2e10, tokens: int = 4) -> dict:
    p, d = LEVELS[level]
    return wire(RoundRecord(
        index=i, time=t, policy="pdmux", level=level, prefill_units=p, decode_units=d, pinned=False, decode_bs=bs,
        decode_step_s=step if bs else 0.0, round_s=step, prefills=list(prefills), tokens_emitted=tokens, waiting=1,
        running=bs, kv_used_tokens=500, kv_capacity_tokens=1000, bytes_moved=bytes_moved, flops=1e12))


def _prefill(ids, done, total=36, k=8, tokens=8192) -> PrefillProgress:
    return PrefillProgress(request_ids=list(ids), tokens=tokens, layers_done=done, layers_total=total,
                           layers_per_round=k)


def _request(kind: str, request_id: int, time: float = 0.0, *, prompt_tokens: int = 10, output_tokens: int = 0,
             ttft_s: float | None = None, itls_s=(), finish_reason: str | None = None) -> dict:
    return wire(RequestRecord(kind, request_id, time, prompt_tokens, output_tokens, ttft_s, list(itls_s),
                              finish_reason))


def _config(time: float, round_index: int, client: str | None = None, **settings) -> dict:
    old = HELLO["engine"]["config"]
    change = ConfigChange(time, round_index, {k: {"old": old[k], "new": v} for k, v in settings.items()}, client)
    return wire(ConfigEvent.after(change, dataclasses.replace(CONFIG, **settings)))


@pytest.fixture
def ev() -> SimpleNamespace:
    """Builders of events as the server sends them: `ev.hello`, `ev.round(i, t, ...)`, `ev.prefill(ids, done)`,
    `ev.request(kind, id, ...)`, `ev.config(time, round_index, client, **settings)`, `ev.levels`."""
    return SimpleNamespace(hello=copy.deepcopy(HELLO), round=_round_event, prefill=_prefill, request=_request,
                           config=_config, levels=LEVELS)
