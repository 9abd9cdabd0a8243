"""Issue 25 item 19: on a cpu dashboard ITL and TPOT read `–` for about 20 s while the step chart already
showed 265 ms steps, and a 1,322 ms warm-up step set the chart's scale for 30 s. ITL now comes from the
rounds' token gaps, TPOT says why it is not there yet, and the engine's first rounds stay out of the scale."""
from __future__ import annotations

import pytest

from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp


def _lines(app, panel: str) -> list[str]:
    return [t.plain for t in app.query_one(panel)._last_texts]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_itl_fills_before_any_request_finishes(busy, until, size):
    engine = busy.engine
    app = PdtopApp(LiveSource(busy.url, token=busy.token))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        while engine.scheduler.round_index < 40 or not engine.scheduler.running:
            engine.step()
        for _ in range(10):
            engine.step()
        target = engine.scheduler.round_index - 1
        await until(pilot, lambda: app.state.round_index >= target, "every round on screen")
        assert app.state.finished == 0  # outputs of 200-600 tokens: nothing has finished
        app.repaint()
        await pilot.pause()
        requests = " ".join(_lines(app, "RequestsPanel"))
        itl50, _, _ = app.state.itl_summary()
        assert itl50 is not None and itl50 > 0, requests
        assert "ITL  p50 –" not in requests and "TPOT" in requests and "until a request finishes" in requests


async def test_a_warm_up_step_does_not_set_the_chart_scale(tmp_path, ev, until):
    rec = Recorder(tmp_path / "warm.ndjson", ev.hello)
    t = 0.0
    for i in range(80):
        step = 1.322 if i == 1 else 0.265  # the first decode step compiles the kernels
        t += step
        rec.write_event(ev.round(i, t, step=step), t=t)
    rec.close()
    src = ReplaySource(tmp_path / "warm.ndjson", speed=16)
    app = PdtopApp(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: src.at_end and app.state.rounds_seen == 80, "every round")
        app.repaint()
        await pilot.pause()
        chart = _lines(app, "StepTimePanel")
        top = next(line for line in chart if "ms" in line.split("│")[0] or " s " in line)
        assert "265 ms" in top or "266 ms" in top, chart  # the scale is the settled steps', not 1.32 s
        assert "p99 487 ms" in str(app.query_one("StepTimePanel").border_title)  # the warm-up step still counts
