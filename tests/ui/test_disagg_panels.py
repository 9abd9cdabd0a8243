"""Under disagg the dashboard shows the two instances and their pools, and the timeline a transfer lane:
live (a sim engine stepped by hand, served on loopback) at 160x48 and 80x24, as SVG snapshots too, and
replayed from a recording that switches to disagg halfway."""
from __future__ import annotations

import asyncio
import re

import pytest
from rich.text import Text

from pdtop.engine.build import build_engine
from pdtop.engine.roofline.kv import parse_link
from pdtop.engine.scheduling.commands import Inject
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.widgets.base import Panel

from .conftest import EngineServer, _until, record_engine


@pytest.fixture
def disagg_busy():
    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b", policy="disagg",
                          workload=WorkloadSpec(rate=6.0, output_tokens=(200, 600), seed=0), seed=0,
                          link=parse_link("rdma100"))
    es = EngineServer(engine, manual=True, max_event_rate=1e9).start()
    yield es
    es.close()


async def _play(pilot, app, engine) -> None:
    """600 rounds, an 8192-token prompt injected every 150; ends with one on the link (its KV in flight)."""
    await _until(pilot, lambda: app.connection == "live", "connected")
    for batch in range(12):
        if batch % 3 == 0:
            engine.control(Inject(8192))
        for _ in range(50):
            engine.step()
        target = engine.scheduler.round_index - 1
        await _until(pilot, lambda target=target: app.state.round_index >= target, f"round {target}")
    engine.control(Inject(8192))
    for _ in range(400):  # until that prompt's KV is on the link
        rec = engine.step()
        if rec.disagg is not None and rec.disagg.transfers:
            break
    target = engine.scheduler.round_index - 1
    await _until(pilot, lambda: app.state.round_index >= target, "the last round")
    assert app.state.disagg is not None and app.state.disagg.transfers == 1 and app.state.transfers


def _settle(app: PdtopApp) -> None:
    app.query_one("StatusLine").clear()
    app.repaint()


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_two_pools_fit_and_say_what_each_instance_does(disagg_busy, size):
    app = PdtopApp(LiveSource(disagg_busy.url, token=disagg_busy.token), slo_ms=12)
    async with app.run_test(size=size) as pilot:
        await _play(pilot, app, disagg_busy.engine)
        app.repaint()
        await pilot.pause()
        for panel in (p for p in app.query(Panel) if p.display):
            lines = [t for t in panel._last_texts if isinstance(t, Text)]
            assert len(lines) <= panel.content_size.height, panel.id
            assert all(t.cell_len <= panel.content_size.width for t in lines), (panel.id, [t.plain for t in lines])
        split = "\n".join(t.plain for t in app.query_one("#split")._last_texts)
        assert "prefill instance · 132 SMs" in split and "decode instance · 132 SMs" in split
        assert re.search(r"link rdma100: 1 (transfers,|xfer) 1\.2 GB in flight", split), split
        if size[1] >= 48:  # room for every row: both pools' KV
            assert split.count("KV") == 2 and "ITL p50" in split and "reserved" in split
        lanes = [t.plain for t in app.query_one("TimelinePanel")._last_texts]
        link = next(lane for lane in lanes if lane.startswith("link"))
        assert link[8:].strip(), "the transfer lane shows the KV in flight"
        assert not any(lane.startswith("split") for lane in lanes)


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_disagg_main_screen(snap_compare, disagg_busy, size):
    app = PdtopApp(LiveSource(disagg_busy.url, token=disagg_busy.token), slo_ms=12)

    async def run_before(pilot) -> None:
        await _play(pilot, app, disagg_busy.engine)
        await asyncio.sleep(0)
        _settle(app)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


async def test_replay_shows_the_switch_to_disagg(tmp_path):
    path = record_engine(tmp_path / "switch.ndjson", 1200, rate=12.0, controls={
        400: {"cmd": "set", "policy": "disagg"}, 700: {"cmd": "inject", "prompt_tokens": 8192}})
    src = ReplaySource(path)
    src.pause()
    app = PdtopApp(src)
    async with app.run_test(size=(120, 30)) as pilot:
        await _until(pilot, lambda: app.state.hello, "hello")
        for n in range(1, 1201):
            src.step()
            await _until(pilot, lambda n=n: app.state.rounds_seen >= n or src.position >= src.duration, f"step {n}",
                         poll=0)
        app.repaint()
        await pilot.pause()
        assert app.state.policy == "disagg" and app.state.transfers
        assert any(c.changes.get("policy") == {"old": "pdmux", "new": "disagg"} for c in app.state.config_changes)
        split = "\n".join(t.plain for t in app.query_one("#split")._last_texts)
        assert "prefill instance" in split and "decode instance" in split


async def _step_until(pilot, engine, predicate, what: str) -> None:
    for _ in range(400):
        if predicate():
            return
        engine.step()
        await pilot.pause(0.01)
    raise AssertionError(f"never: {what}")


async def test_the_policy_key_switches_live_to_disagg_and_back(disagg_busy, until):
    app = PdtopApp(LiveSource(disagg_busy.url, token=disagg_busy.token))
    engine = disagg_busy.engine
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.connection == "live", "connected")
        await _step_until(pilot, engine, lambda: app.state.disagg is not None, "a disagg round")
        for target, keys in (("pdmux", ("up", "up", "up")), ("disagg", ("down", "down", "down"))):
            await pilot.press("p")
            await until(pilot, lambda: type(app.screen).__name__ == "ChoiceScreen", "the policy list")
            await pilot.press(*keys, "enter")
            await _step_until(pilot, engine, lambda t=target: app.state.policy == t, f"policy {target}")
        await _step_until(pilot, engine, lambda: app.state.disagg is not None, "disagg's pools again")
        split = "\n".join(t.plain for t in app.query_one("#split")._last_texts)
        app.repaint()
        await pilot.pause()
        split = "\n".join(t.plain for t in app.query_one("#split")._last_texts)
        assert "prefill instance" in split
