"""Fixtures: SGLang imported (or the tests skipped, saying why), and its classes as they were after each test.

SGLang's `HookRegistry` patches classes and modules for the life of the process and its
`load_plugins()` runs once; each test here loads plugins anew, so the fixture puts back every
attribute the hooks replaced, resets the registry and the runtime context, and stops pdtop's servers.
"""
from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdtop.sglang_plugin.hooks import Plugin
from pdtop.sglang_plugin.tap import TAP_ATTR, SchedulerTap

from .cpu_sglang import (
    SchedulerThread,
    make_scheduler,
    publish_server_args,
    register_stand_ins,
    sglang_or_skip,
)

PDMUX_YAML = "sm_group_num: 8\ndecode_bs_divisor: 4\nsplit_forward_token_budget: 8192\n"


def _snapshot() -> list[tuple[Any, dict[str, Any]]]:
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.multiplex.multiplexing_mixin import SchedulerMultiplexMixin

    owners: list[Any] = [Scheduler, SchedulerMultiplexMixin]
    owners += [m for name, m in list(sys.modules.items()) if name.startswith("sglang") and m is not None]
    return [(owner, dict(vars(owner))) for owner in owners]


@pytest.fixture
def sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SGLang's modules, restored after the test to what they were before its hooks."""
    sglang_or_skip()
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import reset_context

    from pdtop.sglang_plugin import entry

    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # SGLang reads the model's config.json from a local directory
    saved = _snapshot()
    HookRegistry.reset()
    plugins._plugins_loaded = False
    try:
        yield
    finally:
        if entry.installed is not None:
            entry.installed.close()
        entry.installed = None
        HookRegistry.reset()
        plugins._plugins_loaded = False
        for owner, attrs in saved:
            now = vars(owner)
            for name, value in attrs.items():
                if now.get(name) is not value:
                    setattr(owner, name, value)
        reset_context()


@dataclass
class Served:
    """One SGLang scheduler (rank 0 of 1) with pdtop's plugin loaded by SGLang, its loop on a thread."""

    scheduler: Any
    thread: SchedulerThread
    url: str

    @property
    def tap(self) -> SchedulerTap:
        return self.scheduler.__dict__[TAP_ATTR]

    @property
    def switches(self) -> list[int]:
        """The stream group SGLang set at each switch (its model runner is told each one)."""
        return self.scheduler.tp_worker.model_runner.decode_attn_backend


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pdmux_yaml: str | None = PDMUX_YAML,
          env: dict[str, str] | None = None) -> Served:
    """SGLang's `load_plugins()` with PDTOP_SGLANG_PORT set, then a scheduler set up as SGLang does it
    (`init_pdmux` with pdmux), its loop started on a thread: pdtop's server is up."""
    from sglang.srt.plugins import load_plugins

    from pdtop.sglang_plugin import entry

    for name, value in {"PDTOP_SGLANG_PORT": "0", **(env or {})}.items():
        monkeypatch.setenv(name, value)
    register_stand_ins()
    load_plugins()
    scheduler = make_scheduler(publish_server_args(tmp_path, pdmux_yaml))
    if pdmux_yaml is not None:
        scheduler.init_pdmux()
    thread = SchedulerThread(scheduler, "event_loop_pdmux" if pdmux_yaml is not None else "event_loop_normal")
    thread.start()
    if pdmux_yaml is None:  # without pdmux the plugin attaches at the scheduler's first round
        thread.rounds(1)
    assert isinstance(entry.installed, Plugin) and entry.installed.servers, "pdtop's server did not start"
    url = entry.installed.servers[0].url
    assert url is not None
    return Served(scheduler, thread, url)


@pytest.fixture
def served(sglang: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    s = serve(tmp_path, monkeypatch)
    try:
        yield s
    finally:
        s.thread.stop()


class Client:
    """A websocket client of pdtop's protocol that keeps every event it receives, decoded as sent."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> Client:
        from websockets.asyncio.client import connect

        return cls(await connect(url, compression=None))

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in self.ws:
                self.events.append(json.loads(frame))
        except ConnectionClosed:
            pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    async def wait(self, pred: Callable[[Client], bool], timeout: float = 10.0) -> None:
        async def poll() -> None:
            while not pred(self):
                await asyncio.sleep(0.01)
        await asyncio.wait_for(poll(), timeout)

    async def request(self, msg: dict[str, Any] | str) -> dict[str, Any]:
        """Send one control frame; the reply to it."""
        n = len(self.of("reply"))
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)
        await self.wait(lambda c: len(c.of("reply")) > n)
        return self.of("reply")[n]

    async def close(self) -> None:
        await self.ws.close()
        await self.task
