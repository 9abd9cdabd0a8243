"""Snapshots at 160x48 and 80x24 of an SGLang pdmux server attached with its log: a recording of 20 reads
whose `split` came from SGLang's log lines (levels of an H100, the level moving between 2 and 5)."""
from __future__ import annotations

import json

import pytest

from pdtop.telemetry.encode import metrics_event, scrape_hello_event
from pdtop.telemetry.scrape.sglang_log import LogSplit
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp

from .conftest import until_shown as until
from .sglang_lines import adjust, start_up

STARTED = 1_796_000_000.0
URL = "http://10.0.0.1:30000/metrics"


def recording(path) -> None:
    hello = scrape_hello_event(URL, "sglang", "meta-llama/Llama-3.1-8B-Instruct",
                               ["meta-llama/Llama-3.1-8B-Instruct"], 1.0, 30.0)
    lines = [json.dumps({"format": "pdtop-recording", "format_version": 1, "pdtop": "0.1.0", "started": STARTED,
                         "hello": hello})]
    log = LogSplit()
    log.feed(start_up(), 0.0)
    for k in range(20):
        log.feed(adjust(2 + (k // 3) % 4), float(k))  # SGLang's lines, read at k s
        itl = {"count": 400.0, "p50_s": 0.008 + 0.001 * log.level, "p90_s": 0.012, "p99_s": 0.015,
               "first_bound_s": 0.002}
        split = {"source": "log", "inferred": False, "levels": [list(p) for p in log.levels], "level": log.level,
                 "prefill_units": log.prefill_sm, "decode_units": log.decode_sm, "level_time_s": log.times(k + 0.5),
                 "starts": log.starts, "note": None}
        body = {"time": STARTED + k, "window_s": 30.0, "not_exposed": ["split_level", "prefill_units", "decode_units"],
                "running": 24.0, "waiting": 3.0, "kv_usage": 0.41, "prompt_tokens_per_s": 9100.0,
                "generation_tokens_per_s": 2400.0, "ttft": itl, "itl": itl, "e2e": itl,
                "itl_read_p50_s": itl["p50_s"], "split": split, "role": "unified", "disagg": None}
        lines.append(json.dumps({"t": float(k), "event": metrics_event(body)}))
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
