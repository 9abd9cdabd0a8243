"""What the panels write is whole and reads true (issue 42 items 8, 9, 10, 14): no figure loses its end
without an ellipsis, scraped panels keep their words apart, a decode batch larger than running is said so
it does not read as a contradiction, and one formatting module writes every figure."""
from __future__ import annotations

import re

from scrape.servers import PageServer, VllmMetrics

from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.scrape_view import NOT_EXPOSED


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
