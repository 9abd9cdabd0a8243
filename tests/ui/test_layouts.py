"""80x24, 120x30 and 160x48: every panel fits and says something, the header keeps every item, the
footer keeps `? help` and `q quit`, and nothing is drawn outside the panels."""
from __future__ import annotations

import pytest
from rich.text import Text

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.widgets.base import Panel

from .conftest import play_busy


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (160, 48)])
async def test_every_panel_fits(busy, size):
    width, _height = size
    app = PdtopApp(LiveSource(busy.url, token=busy.token), slo_ms=12)
    async with app.run_test(size=size) as pilot:
        await play_busy(pilot, app, busy.engine)
        app.repaint()
        await pilot.pause()
        header = app.query_one("HeaderBar").text
        assert len(header) <= width - 2
        for item in ("● live", "H100", "qwen3-8b", "pdmux", "rec", "dropped 0"):
            assert item in header, (item, header)
        assert len(app.query_one("StatusLine").text) <= width - 2
        shown = [p for p in app.query(Panel) if p.display]
        assert {p.id for p in shown} >= {"split", "requests", "steps", "bandwidth", "timeline"}
        bottom = 0
        for panel in shown:
            inner = panel.content_size.width
            lines = [t for t in panel._last_texts if isinstance(t, Text)]
            assert any(t.plain.strip() for t in lines), f"{panel.id} is empty"
            assert len(lines) <= panel.content_size.height, f"{panel.id}: more lines than rows"
            for line in lines:
                assert line.cell_len <= inner, f"{panel.id} cut at {inner}: {line.plain!r}"
            for edge in (str(panel.border_title or ""), str(panel.border_subtitle or "")):
                assert len(edge) <= panel.outer_size.width - 4, f"{panel.id} border cut: {edge!r}"
            bottom = max(bottom, panel.region.bottom)
        footer = app.query_one("Footer")
        assert bottom <= footer.region.y  # nothing under the footer, no scrolling screen
        keys = {k.action: k.region for k in app.screen.query("FooterKey")}
        for command in ("help", "quit"):
            region = keys[f"run_command('{command}')"]
            assert region.right <= width, command
        steps = app.query_one("StepTimePanel")
        assert steps.content_size.height >= 5  # at least 4 chart rows and the marks
        lanes = [t.plain for t in app.query_one("TimelinePanel")._last_texts]
        assert any(lane.startswith("prefill") and "#" in lane for lane in lanes), lanes  # a prefill's ids
