"""SVG snapshots of the main screen live at 160x48, 120x30 and 80x24, of a paused replay, and of the
command palette, from deterministic inputs.

Live: a sim engine that the test steps by hand (its clock is virtual and its workload seeded),
served over loopback to a `LiveSource`; the picture depends only on the events. Replay: the
session's recording, paused after a seek and a fixed number of steps. The status line's timed
messages are cleared before each picture.
Update with `pytest tests/ui/test_snapshots.py --snapshot-update` after checking the SVGs.
"""
from __future__ import annotations

import asyncio

import pytest

from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp

from .conftest import play_busy


def _settle(app: PdtopApp) -> None:
    app.query_one("StatusLine").clear()
    app.repaint()


@pytest.mark.parametrize("size", [(160, 48), (120, 30), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_main_screen(snap_compare, busy, size):
    app = PdtopApp(LiveSource(busy.url, token=busy.token), slo_ms=12)

    async def run_before(pilot) -> None:
        await play_busy(pilot, app, busy.engine)
        await asyncio.sleep(0)
        _settle(app)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_replay_paused(snap_compare, recording, until):
    src = ReplaySource(recording)
    src.pause()
    src.lookback_s = 0.0  # the seek replays no window: every round on screen is stepped
    app = PdtopApp(src, theme="pdtop-ocean")

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.state.hello, "hello")
        src.seek(2.0)
        await until(pilot, lambda: src.position == 2.0 and app.state.rounds_seen == 0, "the seek")
        for n in range(1, 1801):
            src.step()
            await until(pilot, lambda n=n: app.state.rounds_seen >= n, f"step {n}", poll=0)
        await pilot.press("full_stop")  # and one more by key
        await until(pilot, lambda: app.state.rounds_seen == 1801, "the keyed step")
        _settle(app)

    assert snap_compare(app, terminal_size=(160, 48), run_before=run_before)


def test_command_palette(snap_compare, recording, until):
    """The palette over the main screen: nothing of the panels drawn over it."""
    src = ReplaySource(recording)
    src.pause()
    app = PdtopApp(src)

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.state.hello, "hello")
        for n in range(1, 201):
            src.step()
            await until(pilot, lambda n=n: app.state.rounds_seen >= n, f"step {n}", poll=0)
        _settle(app)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: type(app.screen).__name__ == "CommandPalette", "the palette")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(160, 48), run_before=run_before)
