"""SGLang's scheduler log as the figures' source (issue 40): with `--enable-metrics` off (`/metrics` answers
404, or no URL at all) the dashboard shows running, waiting, KV use and throughput from the Decode/Prefill
batch lines, says so and how old they are; a page that lacks a figure takes it from the log, one that
has it keeps its own; a PD server's queues come from its lines; `record` keeps them."""
from __future__ import annotations

import argparse
import subprocess
import sys
from contextlib import aclosing

from prometheus_client import CollectorRegistry, Histogram

from pdtop.commands import attach
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Metrics
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.sources.log_follow import LogFollower
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.sglang_split import SglangSplit
from pdtop.ui.app import PdtopApp

from ..conftest import header_text, next_of, shown
from ..conftest import until_shown as until
from ..servers import PageServer
from ..sglang_lines import decode_batch, decode_pd, line, old_prefill_pd, prefill_batch

RANKS = " DP0 TP0", " DP1 TP2"  # two DP ranks with DP attention: each logs its own batch


def attach_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    return parser.parse_args(list(argv))


def write_log(path) -> None:
    path.write_text(prefill_batch(running=4, queued=1, rank=RANKS[0]) +
                    decode_batch(7, 2, rank=RANKS[0], throughput=500.0) +
                    decode_batch(5, 1, rank=RANKS[1], throughput=312.45, usage="#token: 9, token usage: 0.05"))


async def test_the_dashboard_shows_the_logs_figures_when_metrics_are_off(tmp_path):
    log = tmp_path / "sglang.log"
    off = PageServer()
    off.status, off.body = 404, b"Not Found"  # SGLang without --enable-metrics
    for argv in ((off.url, "--sglang-log", str(log)), ("--sglang-log", str(log))):  # its URL, or none
        write_log(log)
        source = attach.make_source(attach_args(*argv))
        assert isinstance(source, PrometheusSource)
        source.interval = 0.1
        app = PdtopApp(source, interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda app=app: app.state.scrape is not None and app.state.scrape.latest is not None,
                        "a read from the log")
            m = app.state.scrape.latest
            assert (m.running, m.waiting, m.generation_tokens_per_s, m.prompt_tokens_per_s) == (12, 3, 812.45, 1204.51)
            assert round(m.kv_usage, 3) == 0.04 and m.log.ranks == 2
            requests = shown(app, "RequestsPanel")
            assert "running 12" in requests and "waiting 3" in requests and " 4%" in requests
            assert "output 812" in requests and "prompt 1.2k" in requests
            assert "running, waiting, KV, prompt tok/s, output tok/s from SGLang's log (latest batch line" in requests
            assert "not exposed by this engine" in requests  # TTFT, ITL and E2E: the log has none
            assert "SGLang log" in header_text(app)
            with log.open("a") as f:
                f.write(decode_batch(40, 9, rank=RANKS[0], throughput=900.0))
            await until(pilot, lambda app=app: app.state.scrape.latest.running == 45, "the next batch line")
        await source.close()
    off.close()


async def test_a_page_lacking_a_figure_takes_it_from_the_log_and_keeps_its_own(tmp_path):
    registry = CollectorRegistry()  # an exporter that only has the latency histograms
    itl = Histogram("sglang:inter_token_latency_seconds", "ITL", ["model_name"], buckets=(0.01, 0.1),
                    registry=registry).labels("m")
    itl.observe(0.02)
    page = PageServer(registry)
    log = tmp_path / "sglang.log"
    write_log(log)
    source = PrometheusSource(page.url, interval=0.05, split=SglangSplit(LogFollower(path=str(log))))
    try:
        async with aclosing(source.events()) as events:
            m = decode_event(await next_of(events, "metrics"))
            assert isinstance(m, Metrics) and m.itl is not None and "itl" not in m.log.fields
            assert (m.running, m.waiting) == (12, 3) and m.not_exposed == ["ttft", "e2e", "split_level",
                                                                            "prefill_units", "decode_units"]
    finally:
        await source.close()
        page.close()


async def test_a_pd_servers_queues_come_from_its_lines(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text(decode_batch(18, 3, pd=decode_pd(5, 3, host_receive=2)))
    prefill_log = tmp_path / "prefill.log"
    prefill_log.write_text(old_prefill_pd(bootstrap=4, queued=2, transferring=1) + line("noise", ""))
    for path, want in ((log, {"decode_prealloc_queue": 5, "decode_transfer_queue": 3, "decode_host_receive_queue": 2}),
                       (prefill_log, {"prefill_bootstrap_queue": 4, "prefill_inflight_queue": 1})):
        source = PrometheusSource(None, interval=0.05, split=SglangSplit(LogFollower(path=str(path))))
        try:
            async with aclosing(source.events()) as events:
                m = decode_event(await next_of(events, "metrics"))
            assert {k: getattr(m.disagg, k) for k in want} == want and set(want) <= set(m.log.fields)
        finally:
            await source.close()


def test_record_keeps_the_logs_figures(tmp_path):
    log = tmp_path / "sglang.log"
    write_log(log)
    path = tmp_path / "log.ndjson"
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", "--sglang-log", str(log), "-o", str(path),
                           "--interval", "0.1", "--duration", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reads = [decode_event(event) for _, event in read_recording(path) if event["type"] == "metrics"]
    assert reads and all(m.running == 12 and m.log is not None for m in reads)


def test_no_url_and_no_log_is_one_line():
    done = subprocess.run([sys.executable, "-m", "pdtop", "attach"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--sglang-log FILE" in done.stderr and len(done.stderr.splitlines()) == 1
