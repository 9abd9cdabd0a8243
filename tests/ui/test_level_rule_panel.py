"""`l` sets the level rule live, and the split panel shows the rule in force: under `level_rule:
slo`, its SLO and the decode step its model predicts for the split on screen (Pilot, 160x48 and
80x24)."""
from __future__ import annotations

import re

import pytest
from textual.widgets import Input

from pdtop.engine.scheduling.commands import Set
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp


def split_text(app) -> str:
    panel = app.query_one("SplitPanel")
    lines = [t.plain for t in panel.render_state(app.state).renderables]
    return " ".join(lines) + " " + str(panel.border_subtitle or "")


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_split_panel_shows_the_slo_rule_and_its_prediction(served, until, size):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        assert "rule slo" not in split_text(app)  # SGLang's rule: nothing more to say
        await pilot.press("l")  # the level rule's prompt
        await until(pilot, lambda: len(app.screen_stack) == 2, "the prompt")
        assert app.screen.query_one(Input).value == "sglang"
        app.screen.query_one(Input).value = "slo 16"
        await pilot.press("enter")
        await until(pilot, lambda: served.engine.config_record().level_rule == "slo", "the rule on the engine")
        assert served.engine.config_record().slo_itl_ms == 16.0
        await until(pilot, lambda: app.state.config is not None and app.state.config.level_rule == "slo",
                    "the rule's config event")
        await until(pilot, lambda: "rule slo<=16 ms" in split_text(app), "the rule on screen")
        await until(pilot, lambda: "pred " in split_text(app), "the model's prediction on screen", timeout=30)
        table = split_text(app)
        assert re.search(r"ITL p50 +pred", table)  # the level table: predicted beside measured, per level
        panel = app.query_one("SplitPanel")
        assert all(t.cell_len <= panel.inner_width for t in panel.render_state(app.state).renderables)
        served.engine.control(Set(level_rule="sglang"))  # and back, as any knob
        await until(pilot, lambda: "rule slo" not in split_text(app), "SGLang's rule again")
