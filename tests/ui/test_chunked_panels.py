"""Issue 25 item 14: after `p` → chunked the split panel still said `level 1/2 auto` with ▶ in the level
table, and the prefill row read `15/30 layers chunked ETA -`. Chunked shows its own state: no split
level, and the chunk's progress in tokens with an ETA."""
from __future__ import annotations

import pytest

from pdtop import format as fmt
from pdtop.engine.scheduling.commands import Inject, Set
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp


def _text(app, panel: str) -> str:
    return "\n".join(t.plain for t in app.query_one(panel)._last_texts)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_chunked_shows_chunk_progress_and_no_split_level(stepped, until, size):
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        engine.control(Set(policy="chunked", chunk_size=512))
        for _ in range(5):
            engine.step()
        engine.control(Inject(8192))
        while not any(p.tokens_done for p in engine.scheduler.active.progress()):
            engine.step()
        for _ in range(3):
            engine.step()
        done = engine.scheduler.active.progress()[0].tokens_done
        await until(pilot, lambda: app.state.policy == "chunked" and app.state.prefills
                    and app.state.prefills[0].tokens_done == done, "the chunked prefill on screen")
        await until(pilot, lambda: f"{fmt.count(done)} tok" in _text(app, "PrefillPanel"), "its tokens on screen")
        split, prefill = _text(app, "SplitPanel"), _text(app, "PrefillPanel")
        assert "chunked" in split and "level " not in split and "▶" not in split and "auto" not in split, split
        panel = app.query_one("SplitPanel")
        assert all(t.cell_len <= panel.content_size.width for t in panel._last_texts), split  # nothing cut
        assert "layers" not in prefill and "ETA        –" not in prefill and "ETA –" not in prefill, prefill
        assert app.state.prefills[0].eta_s is not None and app.state.prefills[0].eta_s > 0
        engine.control(Set(policy="pdmux"))
        while app.state.policy != "pdmux" or engine.scheduler.active.progress():
            engine.step()
            await pilot.pause(0)
        await until(pilot, lambda: "level " in _text(app, "SplitPanel"), "the split level back under pdmux")


async def test_the_timeline_draws_no_split_under_chunked(stepped, until):
    """Issue 42 item 5: under chunked the rounds report prefill 132 / decode 132 (one forward on every SM), and
    the timeline's split lane drew that as a 50/50 split while the split panel said "no split level"."""
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        engine.control(Set(policy="chunked"))
        engine.control(Inject(8192))
        for _ in range(200):  # more than the lane shows
            engine.step()
        target = engine.scheduler.round_index - 1
        await until(pilot, lambda: app.state.round_index >= target, "the chunked rounds on screen")
        app.repaint()
        lane = next(t.plain for t in app.query_one("TimelinePanel")._last_texts if t.plain.startswith(("split",
                                                                                                         "no split")))
        cells = lane[8:]
        assert lane.startswith("no split") and set(cells) <= {"─", "·"}, lane
