"""Snapshots at 160x48 and 80x24 of an SGLang pdmux server attached with its log: a recording of 20 reads
whose `split` came from SGLang's log lines (levels of an H100, the level moving between 2 and 5)."""
from __future__ import annotations

import json

import pytest
from telemetry.conftest import until_shown as until
from telemetry.sglang_lines import adjust, start_up

from pdtop.telemetry.encode import wire
from pdtop.telemetry.events import Hello, Metrics, Quantiles, ScrapedSplit, ScrapeTarget
from pdtop.telemetry.scrape.sglang_log import SglangLog
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp

STARTED = 1_796_000_000.0
URL = "http://10.0.0.1:30000/metrics"


def recording(path) -> None:
    target = ScrapeTarget(URL, "sglang", "meta-llama/Llama-3.1-8B-Instruct", ["meta-llama/Llama-3.1-8B-Instruct"],
                          1.0, 30.0)
    hello = wire(Hello(client_id="scrape", readonly=True, engine=None, scrape=target))
    lines = [json.dumps({"format": "pdtop-recording", "format_version": 1, "pdtop": "0.1.0", "started": STARTED,
                         "hello": hello})]
    log = SglangLog()
    log.feed(start_up(), 0.0)
    for k in range(20):
        log.feed(adjust(2 + (k // 3) % 4), float(k))  # SGLang's lines, read at k s
        assert log.level is not None
        itl = Quantiles(400.0, 0.008 + 0.001 * log.level, 0.012, 0.015, 0.002)
        split = ScrapedSplit("log", False, list(log.levels), log.level, log.prefill_sm, log.decode_sm,
                             log.times(k + 0.5), log.starts)
        read = Metrics(STARTED + k, 30.0, 24.0, 3.0, 0.41, 9100.0, 2400.0, itl, itl, itl.p50_s, itl,
                       not_exposed=["split_level", "prefill_units", "decode_units"], role="unified", split=split)
        lines.append(json.dumps({"t": float(k), "event": wire(read)}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
def test_snapshot_of_an_sglang_split_from_its_log(snap_compare, tmp_path, size):
    path = tmp_path / "sglang.ndjson"
    recording(path)
    app = PdtopApp(ReplaySource(path, speed=16.0), interval_s=0.05)

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None
                    and app.state.scrape.latest.time == STARTED + 19, "the whole recording")
        app.repaint()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
