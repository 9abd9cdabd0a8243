"""The level table (issue 42 item 7): an SGLang server's levels from its log listed only some levels in one
column at 160 columns, and nothing said rows were hidden. Both split panels use one table: two columns
where the rows need them and the width allows, and a line saying how many levels are not listed."""
from __future__ import annotations

import re

from telemetry.servers import PageServer, SglangMetrics
from telemetry.sglang_lines import H100_LEVELS, adjust, decode_batch, start_up

from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.log_follow import LogFollower
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.sglang_split import SglangSplit
from pdtop.ui.app import PdtopApp
from pdtop.ui.window_figures import level_rows


def _split(app) -> list[str]:
    app.repaint()
    return [t.plain for t in app.query_one("SplitPanel")._last_texts]


def _listed(lines: list[str]) -> set[str]:
    """The splits the table lists (`P/D` of each row)."""
    return {m.group(1) for line in lines for m in re.finditer(r"[▶ ]\s*\d+  \S*\s+(\d+/\d+)", line)}


async def test_every_level_of_an_sglang_log_is_listed_at_160_columns(tmp_path, until):
    metrics = SglangMetrics()
    metrics.server = PageServer(metrics.registry)
    log = tmp_path / "sglang.log"
    log.write_text(decode_batch() + start_up() + adjust(4))
    source = PrometheusSource(metrics.server.url, interval=0.1, window_s=600.0,
                              split=SglangSplit(LogFollower(path=str(log))))
    try:
        app = PdtopApp(source, interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None
                        and app.state.scrape.latest.split is not None
                        and app.state.scrape.latest.split.level == 4, "level 4 from the log")
            lines = _split(app)
            assert _listed(lines) == {f"{p}/{d}" for p, d in H100_LEVELS}, lines
            assert not any("not listed" in line for line in lines)
        await source.close()
    finally:
        metrics.server.close()


async def test_a_table_that_cannot_list_every_level_says_so(served, until):
    """80x24: the split panel has room for a few rows; the current level is listed, and a line says how many
    levels are not."""
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.connection == "live" and app.state.level is not None, "live rounds")
        lines = _split(app)
        panel = app.query_one("SplitPanel")
        hidden = next((line for line in lines if "not listed" in line), None)
        assert hidden is not None, lines
        rows = level_rows(app.state.levels, app.state.window(), app.state.levels_since)
        listed = len(_listed(lines)) + any(line.lstrip("▶ ").startswith("idle") for line in lines)
        assert hidden.startswith(f"+{len(rows) - listed} more not listed"), (hidden, lines)
        assert f"{app.state.prefill_units}/{app.state.decode_units}" in _listed(lines)  # the current level stays
        assert all(len(line) <= panel.content_size.width for line in lines), lines
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.connection == "live" and app.state.level is not None, "live rounds")
        lines = _split(app)
        assert _listed(lines) == {f"{p}/{d}" for p, d in app.state.levels} and not any("not listed" in x
                                                                                       for x in lines), lines
