"""SVG snapshots of the main screen, live and in replay, from deterministic inputs.

Live: a sim engine that the test steps by hand (its clock is virtual and its workload
seeded), served over loopback to a `LiveSource`; the picture depends only on the events.
Replay: the session's recording, paused after a seek and a fixed number of steps.
Update with `pytest tests/ui/test_snapshots.py --snapshot-update` after checking the SVGs.
"""
from __future__ import annotations

import asyncio

from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp

SIZE = (130, 40)




def test_live_main_screen(snap_compare, stepped, until):
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token), slo_ms=12)
    engine = stepped.engine

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.connection == "live", "connected")
        for batch in range(31):  # 3010 rounds, in batches the client keeps up with (nothing dropped)
            if batch == 30:
                engine.control({"cmd": "inject", "prompt_tokens": 32768})
            for _ in range(100 if batch < 30 else 10):
                engine.step()
            target = engine.scheduler.round_index
            await until(pilot, lambda target=target: app.state.round_index >= target - 1, f"round {target}")
        assert app.state.dropped == 0 and app.state.prefills
        await asyncio.sleep(0)
        app.repaint()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_replay_paused(snap_compare, recording, until):
    src = ReplaySource(recording)
    src.pause()
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
        app.repaint()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
