"""SGLang's own `load_plugins()` finds pdtop's entry point and its `HookRegistry` applies the hooks; when
anything is wrong (a bad setting, an SGLang release the plugin does not know, a missing target, a port in
use, a hook that fails on what it reads) it is one warning line and SGLang runs as without pdtop."""
from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdtop.sglang_plugin import entry, hooks

from .conftest import PDMUX_YAML, Client, Served
from .cpu_sglang import Req, SchedulerThread, make_scheduler, publish_server_args, register_stand_ins

TARGETS = {"SchedulerMultiplexMixin": ("init_pdmux", "adjust_stream_groups"),
           "Scheduler": ("process_input_requests", "run_batch", "process_batch_result", "_add_request_to_queue",
                         "set_internal_state")}


def hooked() -> dict[str, bool]:
    """Each target: whether SGLang's HookRegistry replaced it with a wrapper of pdtop's hook."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.multiplex.multiplexing_mixin import SchedulerMultiplexMixin

    owners = {"Scheduler": Scheduler, "SchedulerMultiplexMixin": SchedulerMultiplexMixin}
    out = {}
    for owner, names in TARGETS.items():
        for name in names:
            fn = owners[owner].__dict__[name]
            cells = [c.cell_contents for c in getattr(fn, "__closure__", None) or ()]
            out[name] = any(isinstance(getattr(c, "__self__", None), hooks.Plugin) for c in cells)
    return out


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pdtop.sglang_plugin" and r.levelno >= logging.WARNING]


def test_load_plugins_finds_pdtop_and_the_registry_applies_every_hook(sglang: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins import load_plugins, load_plugins_by_group

    monkeypatch.setenv("PDTOP_SGLANG_PORT", "0")
    assert "pdtop" in load_plugins_by_group("sglang.srt.plugins")
    load_plugins()
    assert isinstance(entry.installed, hooks.Plugin)
    assert all(hooked().values()), hooked()


def test_sglang_plugins_can_leave_pdtop_out(sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins import load_plugins

    monkeypatch.setenv("PDTOP_SGLANG_PORT", "0")
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    load_plugins()
    assert entry.installed is None and not any(hooked().values())


@pytest.mark.parametrize(("env", "words"), [
    ({"PDTOP_SGLANG_PORT": "http"}, "is not a port"),
    ({"PDTOP_SGLANG_PORT": "70000"}, "is not a port"),
    ({"PDTOP_SGLANG_PORT": "0", "PDTOP_SGLANG_HOST": "0.0.0.0"}, "set PDTOP_TOKEN too"),
])
def test_a_bad_setting_is_one_warning_and_no_hook(sglang: None, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture, env: dict[str, str],
                                                  words: str) -> None:
    from sglang.srt.plugins import load_plugins

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    load_plugins()
    assert entry.installed is None and not any(hooked().values())
    assert len(warnings(caplog)) == 1 and words in warnings(caplog)[0]


def test_an_unknown_release_or_a_missing_target_is_one_warning_and_no_hook(
        sglang: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins import load_plugins

    monkeypatch.setenv("PDTOP_SGLANG_PORT", "0")
    monkeypatch.setattr(hooks.facts, "sglang_version", lambda: "0.5.10")
    assert hooks.install(entry.Settings(0)) is None
    assert "SGLang 0.5.10 is not a release its plugin supports (0.5.11 to 0.5.23)" in warnings(caplog)[0]
    monkeypatch.undo()

    monkeypatch.setenv("PDTOP_SGLANG_PORT", "0")
    monkeypatch.delattr(Scheduler, "_add_request_to_queue")  # as in a release without it
    load_plugins()
    assert entry.installed is None
    assert warnings(caplog)[-1].endswith("has no sglang.srt.managers.scheduler.Scheduler._add_request_to_queue; "
                                         "SGLang runs without pdtop")
    assert len(warnings(caplog)) == 2


def test_a_port_in_use_is_one_warning_and_sglang_runs_on(sglang: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.plugins import load_plugins


    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setenv("PDTOP_SGLANG_PORT", str(taken.getsockname()[1]))
    register_stand_ins()
    load_plugins()
    scheduler = make_scheduler(publish_server_args(tmp_path, PDMUX_YAML))
    scheduler.init_pdmux()
    thread = SchedulerThread(scheduler).start()
    try:
        thread.rounds(12, [Req(f"d{i}", [5] * 256, 500) for i in range(3)])
        thread.rounds(3, [Req("p", [5] * 2048, 2)])
    finally:
        thread.stop()
        taken.close()
    assert isinstance(entry.installed, hooks.Plugin) and not entry.installed.servers
    assert len(warnings(caplog)) == 1 and "could not serve on 127.0.0.1" in warnings(caplog)[0]
    assert scheduler.tp_worker.model_runner.decode_attn_backend[-1] == 4  # SGLang's own choice, as ever


async def test_a_hook_that_fails_is_one_warning_and_the_rounds_go_on(served: Served,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    client = await Client.open(served.url)
    await client.wait(lambda c: bool(c.of("hello")))
    hostile = Req("ok", [5] * 256, 500)
    hostile.rid = ["a list is no request id"]  # type: ignore[assignment]
    await asyncio.to_thread(served.thread.rounds, 8, [hostile, Req("d1", [5] * 256, 500)])
    await asyncio.to_thread(served.thread.rounds, 3, [Req("p", [5] * 2048, 2)])
    assert served.switches[-1] == 3  # SGLang's choice for 2 decoding: 2 * 6 // 4
    lines = warnings(caplog)
    assert lines and all(line.startswith("pdtop: ") and "SGLang goes on" in line for line in lines)
    assert len(lines) == len(set(lines))  # each kind of failure once, however often it happens
    assert isinstance(entry.installed, hooks.Plugin) and entry.installed.faults > len(lines)  # the rest counted
    await client.close()


def test_off_the_entry_point_imports_nothing_of_sglang_nor_the_dashboard() -> None:
    """What SGLang's processes import when they run pdtop's entry point without PDTOP_SGLANG_PORT, and what the
    plugin's modules pull in at all (never the dashboard)."""
    code = ("import os, sys\nos.environ.pop('PDTOP_SGLANG_PORT', None)\n"
            "from pdtop.sglang_plugin.entry import register\nregister()\n"
            "off = sorted(m for m in sys.modules if m.startswith(('sglang', 'torch', 'websockets')))\n"
            "import pdtop.sglang_plugin.hooks\n"
            "print(off, sorted(m for m in sys.modules if m.startswith(('textual', 'pdtop.ui', 'sglang'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []"
