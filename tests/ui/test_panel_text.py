"""What the panels write is whole and reads true (issue 42 items 8, 9, 10, 14): no figure loses its end
without an ellipsis, scraped panels keep their words apart, a decode batch larger than running is said so
it does not read as a contradiction, and one formatting module writes every figure."""
from __future__ import annotations

import re

from telemetry.servers import PageServer, VllmMetrics
from textual.widgets import Input

from pdtop import format as fmt
from pdtop.engine.scheduling.commands import Set
from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.scrape_view import NOT_EXPOSED
from pdtop.ui.screens.tune import TuneScreen
from pdtop.ui.words import MARK_WORDS, MARKS


def _drawn(panel) -> list[str]:
    """The panel's rows as drawn on the screen."""
    return [panel.render_line(y).text for y in range(panel.content_size.height)]


async def test_the_host_line_keeps_its_memory_figure_whole_at_80x24(tmp_path, ev, until):
    """Item 8: 16 cores' figures pushed `mem 18%` past the panel's edge, drawn as `mem 18`."""
    rec = Recorder(tmp_path / "hw.ndjson", ev.hello)
    for i in range(5):
        rec.write_event(ev.round(i, 0.01 * (i + 1)), t=0.01 * i)
    rec.write_event({"type": "hw", "v": 1, "time": 0.05, "cpu_percent": [float(10 + i) for i in range(16)],
                     "host_mem_used_bytes": 3 << 30, "host_mem_total_bytes": 16 << 30, "host_mem_percent": 18.0},
                    t=0.05)
    rec.close()
    app = PdtopApp(ReplaySource(tmp_path / "hw.ndjson", speed=16))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.hw is not None, "the hw sample")
        app.repaint()
        await pilot.pause()
        rows = _drawn(app.query_one("BandwidthPanel"))
        host = next(row for row in rows if row.startswith("host"))
        assert "mem 18%" in host and host.rstrip().endswith("…"), rows


async def test_scraped_panels_keep_their_words_apart(until):
    """Item 9: "running not exposed by this enginewaiting not exposed by th…"."""
    for missing in (("running", "waiting"), ("running",)):
        metrics = VllmMetrics()
        for name in missing:
            metrics.registry.unregister(getattr(metrics, name))
        server = PageServer(metrics.registry)
        try:
            for size in ((160, 48), (80, 24)):
                app = PdtopApp(PrometheusSource(server.url, interval=0.1), interval_s=0.05)
                async with app.run_test(size=size) as pilot:
                    await until(pilot, lambda app=app: app.state.scrape is not None
                                and app.state.scrape.latest is not None, "a read")
                    app.repaint()
                    for panel in app.query("Panel"):
                        for line in (t.plain for t in panel._last_texts):
                            assert not re.search(re.escape(NOT_EXPOSED) + r"\w", line), line
                    load = app.query_one("RequestsPanel")._last_texts[0].plain
                    assert ("running, waiting not exposed" in load) if len(missing) == 2 else \
                        re.search(r"running not exposed by this engine +waiting \d", load), load
        finally:
            server.close()


async def test_a_batch_larger_than_running_reads_as_the_last_rounds(tmp_path, ev, until):
    """Item 10: `running 49 waiting 0 decode batch 50`: running is counted after the round's finishes, the
    batch is the round's own. The panel says the batch is what the last round decoded."""
    rec = Recorder(tmp_path / "finishing.ndjson", ev.hello)
    for i in range(5):
        event = ev.round(i, 0.01 * (i + 1), bs=50)
        event["running"] = 49 if i == 4 else 50  # the last round finished one of its 50
        rec.write_event(event, t=0.01 * i)
    rec.close()
    for size in ((160, 48), (120, 30), (80, 24)):
        app = PdtopApp(ReplaySource(tmp_path / "finishing.ndjson", speed=16))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda app=app: app.state.round_index == 4, "the rounds")
            app.repaint()
            panel = app.query_one("RequestsPanel")
            load = panel._last_texts[0].plain
            assert "decoded 50" in load and "batch" not in load and "49" in load, load
            assert size == (80, 24) or "decoded 50 last round" in load, load
            assert len(load) <= panel.content_size.width, load


async def test_an_empty_chart_labels_no_scale(recording, until):
    """Item 14: with nothing drawn, the step chart and the timeline labelled their scale "1.00 ms"."""
    src = ReplaySource(recording)
    src.pause()
    app = PdtopApp(src)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.hello, "the hello")
        app.repaint()
        for panel in ("StepTimePanel", "TimelinePanel"):
            lines = [t.plain for t in app.query_one(panel)._last_texts]
            assert not any(" ms" in line for line in lines), (panel, lines)


async def test_a_figure_reads_the_same_in_every_panel(served, until):
    """Item 14: `348.8 ms` beside `349 ms`, `15,709` beside `5.6k`: the knobs line's prediction is written as
    the level table writes it, and an injected prompt's size as the prefill panel writes a prompt's tokens
    (`fmt.count`)."""
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        served.engine.control(Set(level_rule="slo", slo_itl_ms=16.0))
        await until(pilot, lambda: app.state.predicted_steps_s is not None and app.state.level is not None
                    and app.state.predicted_steps_s[app.state.level] is not None, "a prediction", timeout=30)
        app.repaint()
        panel = app.query_one("SplitPanel")
        text = "\n".join(t.plain for t in panel._last_texts) + "\n" + str(panel.border_subtitle)
        said = re.search(r"pred (\d[\d.]* ms)", text).group(1)
        cell = re.search(r"▶ +\d+ +\S+ +\d+/\d+ +(?:\d+%|–) +(?:[\d.]+ ms|–) +([\d.]+ ms|–)", text)
        assert cell and cell.group(1) == said, (said, text)  # the current level's pred column: the same text
        app.notices.clear()
        await pilot.press("i")
        await until(pilot, lambda: len(app.screen_stack) == 2, "the inject prompt")
        app.screen.query_one(Input).value = "15709"
        await pilot.press("enter")
        await until(pilot, lambda: any(n[1] == "applied" for n in app.notices), "the inject applied")
        told = next(n[2] for n in app.notices if n[1] == "applied")
        assert f"a prompt of {fmt.count(15709)} tokens" in told, told  # as the prefill panel writes its tokens


async def test_the_tuning_table_writes_unmeasured_figures_as_the_panels_do(until):
    """Item 14: the live-tuning table wrote `- ms` where every panel writes `–`."""
    from pdtop.engine.build import build_engine

    from .conftest import EngineServer

    es = EngineServer(build_engine("sim:H100", workload=None)).start()  # nothing decodes: nothing is measured
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.rounds_seen > 2 and app.connection == "live", "live rounds")
            await pilot.press("u")
            await until(pilot, lambda: len(app.screen_stack) == 2, "the tune prompt")
            app.screen.query_one(Input).value = "50 0.2"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, TuneScreen), "the tune panel")
            screen = app.screen
            await until(pilot, lambda: not screen.running, "the tune to finish", timeout=60)
            table = str(screen.query_one("#tune-table").render())
            assert "- ms" not in table and " -/s" not in table and f"{fmt.MISSING}" in table, table
            await pilot.press("r")
    finally:
        es.close()


async def test_the_step_charts_marks_are_named_where_the_words_do_not_fit(tmp_path, ev, until):
    """Issue 42's trial: at 80x24 the chart's one-letter marks had no legend (at 160 columns the latest
    change is said in words); where the words do not fit, each letter shown is named in one word. Changes
    just made sit at the right edge: then the words go left of the marks."""
    def record(name: str, at: tuple[int, int]) -> None:
        rec = Recorder(tmp_path / name, ev.hello)
        for i in range(300):  # 30 s, the chart's window
            rec.write_event(ev.round(i, 0.1 * (i + 1)), t=0.1 * i)
            if i == at[0]:
                rec.write_event(ev.config(0.1 * i + 0.05, i, decode_bs_divisor=24), t=0.1 * i + 0.05)
            if i == at[1]:
                rec.write_event(ev.config(0.1 * i + 0.05, i, pinned_level=1), t=0.1 * i + 0.05)
        rec.close()

    record("marks.ndjson", (20, 40))  # early in the window: room for words after them
    record("late.ndjson", (290, 296))  # just made
    record("middle.ndjson", (140, 170))  # mid-window: little room either side at 80 columns

    async def last_row(size: tuple[int, int], name: str = "marks.ndjson") -> str:
        app = PdtopApp(ReplaySource(tmp_path / name, speed=16))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: len(app.state.config_changes) == 2 and app.state.rounds_seen >= 300, "changes")
            app.repaint()
            await pilot.pause()
            return _drawn(app.query_one("StepTimePanel"))[-1]

    narrow, wide = await last_row((80, 24)), await last_row((160, 48))
    assert "L: pinned level 1: prefill 112 SMs, decode 20" in wide, wide  # the latest change, in words
    assert narrow.rstrip().endswith("d: divisor  L: level"), narrow
    late = await last_row((160, 48), "late.ndjson")
    assert "0  L: pinned level 1: prefill 112 SMs, decode 20" in late and late.rstrip().endswith("d L"), late
    middle = await last_row((80, 24), "middle.ndjson")  # no room for the legend of both: the latest mark's word
    assert "L: level" in middle and "divisor" not in middle, middle
    assert set(MARKS.values()) | {"*"} == set(MARK_WORDS)  # every letter has its word


async def test_the_timelines_prefill_ids_are_never_cut(tmp_path, ev, until):
    """Issue 42's trial: at 80x24 prefills in quick succession read `#123…#12…#1236`, a cut id reading as
    another request. An id is whole (the first of a batch where `+N` does not fit) or a dot."""
    rec = Recorder(tmp_path / "ids.ndjson", ev.hello)
    ids = []
    for i in range(90):
        batch = [1200 + i // 6, 1300 + i // 6]  # a new prefill of two every sixth round: `#1200+1` is 7 wide
        ids += batch
        rec.write_event(ev.round(i, 0.01 * (i + 1), prefills=[ev.prefill(batch, 6 * (i % 6))]), t=0.01 * i)
    rec.close()
    app = PdtopApp(ReplaySource(tmp_path / "ids.ndjson", speed=16))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen >= 90, "the rounds")
        app.repaint()
        await pilot.pause()
        row = next(t.plain for t in app.query_one("TimelinePanel")._last_texts if t.plain.startswith("prefill "))
    shown = re.findall(r"#(\d+)", row)
    assert shown and all(int(x) in ids for x in shown) and "…" not in row, row
