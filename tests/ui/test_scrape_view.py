"""The dashboard attached to a `/metrics` page (Pilot): known values of vLLM's and SGLang's loopback servers
on screen, what the server does not expose said so, the model chosen, read-only keys that say why, a
server that is not there or not a metrics page, and a recorded scrape session replayed."""
from __future__ import annotations

import asyncio
import socket

from prometheus_client import generate_latest
from telemetry.conftest import header_text, shown
from telemetry.conftest import until_shown as until
from telemetry.servers import LLAMA, PageServer, VllmMetrics

from pdtop import format as fmt
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.scrape_view import NOT_EXPOSED

QWEN = "Qwen/Qwen3-8B"


def app_for(url: str, **options) -> PdtopApp:
    return PdtopApp(PrometheusSource(url, **{"interval": 0.1, "window_s": 600.0, **options}), interval_s=0.05)


async def test_vllm_values_percentiles_and_what_is_not_exposed_on_screen(vllm):
    m = vllm.m
    m(vllm.running).set(3)
    m(vllm.waiting).set(5)
    m(vllm.kv).set(0.42)
    app = app_for(vllm.server.url)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.scrapes >= 1, "the first read")
        # in the window: 4 gaps in (0.01, 0.025], 4 in (0.025, 0.05], 2 in (0.05, 0.075]
        for v in [0.02] * 4 + [0.03] * 4 + [0.06] * 2:
            m(vllm.itl).observe(v)
        for v in (0.3, 0.3, 0.6, 0.6):
            m(vllm.ttft).observe(v)
        await until(pilot, lambda: app.state.scrape.latest.itl.count == 10 and app.state.scrape.latest.ttft.count == 4,
                    "the observations read")
        requests = shown(app, "RequestsPanel")
        assert "running 3" in requests and "waiting 5" in requests and "42%" in requests
        # histogram_quantile by hand: rank 5 is the 1st of 4 in (0.025, 0.05]; rank 9.9 is 1.9 of 2 in (0.05, 0.075]
        itl_p50, itl_p99 = 0.025 + 0.025 * 1 / 4, 0.05 + 0.025 * 1.9 / 2
        ttft_p50 = 0.25 + 0.25 * 2 / 2  # rank 2: the 2nd of 2 in (0.25, 0.5]
        assert f"p50 {fmt.duration(itl_p50)}" in requests and f"p99 {fmt.duration(itl_p99)}" in requests
        assert f"TTFT p50 {fmt.duration(ttft_p50)}" in requests
        assert "E2E  p50 –" in requests  # exposed, nothing finished in the window
        chart = shown(app, "StepTimePanel")
        assert f"ITL p50 {fmt.ms(itl_p50)}  p99 {fmt.ms(itl_p99)}" in chart
        assert f"SM split: {NOT_EXPOSED}" in shown(app, "SplitPanel")
        for panel in ("BandwidthPanel", "TimelinePanel", "PrefillPanel"):
            assert NOT_EXPOSED in shown(app, panel)
        header = header_text(app)
        assert "● live" in header and "read-only" in header and "vLLM /metrics" in header and LLAMA in header
        await pilot.press("plus")  # a key that would steer says why it cannot
        await pilot.pause(0.1)
        severity, _title, message = app.notices[-1]
        assert severity == "error" and "only reads this server's /metrics" in message


async def test_sglang_values_on_screen(sglang):
    sglang.running.set(12)
    sglang.queue.set(4)
    sglang.token_usage.set(0.8)
    app = app_for(sglang.server.url)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.scrapes >= 2, "two reads")
        requests = shown(app, "RequestsPanel")
        assert "running 12" in requests and "waiting 4" in requests and "80%" in requests
        assert "tok/s prompt 0  output 0" in requests  # exposed, and nothing happened: 0, not "not exposed"
        assert "SGLang" in header_text(app)


async def test_the_model_chosen_of_several_is_in_the_header_and_a_gauge_missing_says_not_exposed():
    metrics = VllmMetrics(models=(LLAMA, QWEN))
    metrics.m(metrics.running, QWEN).set(9)
    metrics.registry.unregister(metrics.waiting)  # a page without this gauge
    server = PageServer(metrics.registry)
    try:
        app = app_for(server.url, model_name=QWEN)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
            assert f"{QWEN} (2 of 2 models, --model-name)" in header_text(app)
            requests = shown(app, "RequestsPanel")
            assert "running 9" in requests and f"waiting {NOT_EXPOSED}" in requests
    finally:
        server.close()


async def test_a_server_that_is_not_there_then_a_login_page_show_why_and_the_retry():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = app_for(f"http://127.0.0.1:{port}", interval=5.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: "connection refused" in app.status_text().plain, "the reason")
        status = app.status_text().plain
        assert f"cannot reach http://127.0.0.1:{port}/metrics" in status and "retrying in" in status
        assert "connecting" in header_text(app)
    server = PageServer()
    server.body, server.content_type = b"<html><body>Sign in</body></html>", "text/html"
    try:
        app = app_for(server.url)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: "an HTML page, not Prometheus metrics" in app.status_text().plain,
                        "the page said what it is")
    finally:
        server.close()


async def test_a_recorded_scrape_session_replays_on_the_same_panels(vllm, tmp_path):
    from pdtop.telemetry.recording.recorder import Recorder

    vllm.m(vllm.running).set(7)
    out = tmp_path / "vllm.ndjson"
    src = PrometheusSource(vllm.server.url, interval=0.05)
    recorder = None
    async for event in src.events():
        if recorder is None:
            recorder = Recorder(out, event)
        else:
            recorder.write_event(event)
        if event["type"] == "metrics" and event["window_s"] > 0:
            break
    await src.close()
    recorder.close()
    app = PdtopApp(ReplaySource(out), interval_s=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.scrapes >= 2, "the replay")
        assert "running 7" in shown(app, "RequestsPanel")
        app.source.transport.seek(0.0)
        await asyncio.sleep(0.2)
        await until(pilot, lambda: app.state.scrape.latest is not None, "after the seek")
        assert app.source_error is None


def test_snapshot_of_an_attached_vllm_session(snap_compare):
    """40 reads of a vLLM page, one a second by the source's clock: load rising, then an ITL spike."""
    metrics = VllmMetrics()
    m = metrics.m
    pages = []
    for k in range(40):
        m(metrics.running).set(min(32, 4 + k))
        m(metrics.waiting).set(max(0, k - 28))
        m(metrics.kv).set(min(0.97, 0.1 + k * 0.025))
        m(metrics.prompt_tokens).inc(2048 * (k % 3))
        m(metrics.generation_tokens).inc(40 * min(32, 4 + k))
        for gap in [0.012 + 0.0005 * k] * 30 + ([0.09] * 4 if 30 <= k < 34 else []):
            m(metrics.itl).observe(gap)
        m(metrics.ttft).observe(0.05 + 0.01 * k)
        if k % 2:
            m(metrics.e2e).observe(1.2 + 0.05 * k)
        pages.append(generate_latest(metrics.registry))
    server = PageServer(metrics.registry)
    server.pages = pages
    source = PrometheusSource(server.url, interval=0.05, clock=lambda: 1_000.0 + min(len(server.requests), len(pages)))
    app = PdtopApp(source, slo_ms=50)

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None
                    and app.state.scrape.latest.time == 1_000.0 + len(pages), "every page read")
        app.query_one("StatusLine").clear()
        app.repaint()

    try:
        assert snap_compare(app, terminal_size=(160, 48), run_before=run_before)
    finally:
        server.close()


def test_attach_options_for_http_urls():
    import argparse
    import subprocess
    import sys

    from pdtop.commands import attach

    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    args = parser.parse_args(["http://127.0.0.1:9", "--model-name", QWEN, "--token", "t"])
    source = attach.make_source(args)
    assert isinstance(source, PrometheusSource) and source.interval == 1.0 and source.want_model == QWEN
    assert source.url == "http://127.0.0.1:9/metrics" and source.token == "t" and args.interval == 0.1
    args = parser.parse_args(["http://127.0.0.1:9/stats", "--interval", "2"])
    source = attach.make_source(args)
    assert source.interval == 2.0 and source.url == "http://127.0.0.1:9/stats"
    for argv, said in ((["http://127.0.0.1:9", "--interval", "0"], "--interval must be 0.05 to 3600 seconds"),
                       (["ws://127.0.0.1:9", "--model-name", "m"], "--model-name is for http:// URLs")):
        done = subprocess.run([sys.executable, "-m", "pdtop", "attach", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1


async def test_nan_and_inf_show_as_such(vllm):
    vllm.m(vllm.running).set(float("nan"))
    vllm.m(vllm.kv).set(float("inf"))
    app = app_for(vllm.server.url)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
        requests = shown(app, "RequestsPanel")
        assert "running NaN" in requests and "+Inf" in requests and app.source_error is None
