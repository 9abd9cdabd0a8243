"""`PrometheusSource` against real HTTP servers on loopback with vLLM's and SGLang's metrics: the figures
it sends, percentiles over the window equal to `histogram_quantile` worked out by hand, counter resets,
and every page that is not what it expects."""
from __future__ import annotations

import asyncio
import math
import socket
import time
from contextlib import aclosing

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from pdtop.engine.scheduling.commands import PinLevel
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Hello, Metrics
from pdtop.telemetry.sources.prometheus import PrometheusSource, metrics_url
from pdtop.telemetry.sources.source import ControlRefused

from ..conftest import next_of
from ..servers import LLAMA, PageServer, VllmMetrics

QWEN = "Qwen/Qwen3-8B"
SPLIT = ["split_level", "prefill_units", "decode_units"]


def source(server: PageServer, **options) -> PrometheusSource:
    return PrometheusSource(server.url, **{"interval": 0.05, "window_s": 600.0, **options})


async def metrics(events) -> Metrics:
    event = decode_event(await next_of(events, "metrics"))
    assert isinstance(event, Metrics)
    return event


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.02)


def observe(histogram, values) -> None:
    for v in values:
        histogram.observe(v)


async def test_vllm_figures_and_percentiles_over_the_window(vllm):
    m = vllm.m
    m(vllm.running).set(3)
    m(vllm.waiting).set(5)
    m(vllm.kv).set(0.42)
    observe(m(vllm.itl), [5.0] * 100)  # before the first scrape: outside the window
    m(vllm.generation_tokens).inc(10_000)
    async with aclosing(source(vllm.server).events()) as events:
        hello = decode_event(await next_of(events, "hello"))
        assert isinstance(hello, Hello) and hello.engine is None and hello.readonly
        assert hello.scrape is not None and (hello.scrape.engine, hello.scrape.model_name) == ("vllm", LLAMA)
        assert hello.scrape.models == [LLAMA] and hello.scrape.url == vllm.server.url + "/metrics"
        first = await metrics(events)
        assert (first.running, first.waiting, first.kv_usage) == (3.0, 5.0, 0.42)
        assert first.window_s == 0 and first.generation_tokens_per_s is None  # nothing to compare yet
        assert first.itl is not None and first.itl.count == 0 and first.itl.p50_s is None
        assert first.not_exposed == SPLIT and first.split_level is None

        # in the window: 4 gaps in (0.01, 0.025], 4 in (0.025, 0.05], 2 in (0.05, 0.075]
        observe(m(vllm.itl), [0.02] * 4 + [0.03] * 4 + [0.06] * 2)
        observe(m(vllm.ttft), [0.3, 0.3, 0.6, 0.6])  # 2 in (0.25, 0.5], 2 in (0.5, 0.75]
        m(vllm.generation_tokens).inc(500)
        m(vllm.prompt_tokens).inc(1200)
        m(vllm.running).set(7)
        second = await metrics(events)
    assert second.running == 7.0 and second.window_s > 0
    itl = second.itl
    assert itl is not None and itl.count == 10
    assert itl.p50_s == pytest.approx(0.025 + 0.025 * 1 / 4)  # rank 5: the 1st of 4 in (0.025, 0.05]
    assert itl.p90_s == pytest.approx(0.05 + 0.025 * 1 / 2)  # rank 9: the 1st of 2 in (0.05, 0.075]
    assert itl.p99_s == pytest.approx(0.05 + 0.025 * 1.9 / 2)  # rank 9.9
    ttft = second.ttft
    assert ttft is not None and ttft.count == 4
    assert ttft.p50_s == pytest.approx(0.25 + 0.25 * 2 / 2) and ttft.p90_s == pytest.approx(0.5 + 0.25 * 1.6 / 2)
    assert second.e2e is not None and second.e2e.count == 0 and second.e2e.p99_s is None
    assert second.generation_tokens_per_s * second.window_s == pytest.approx(500)
    assert second.prompt_tokens_per_s * second.window_s == pytest.approx(1200)


async def test_observations_leave_the_window_as_it_moves_on(vllm):
    m = vllm.m
    async with aclosing(source(vllm.server, window_s=0.3).events()) as events:
        await metrics(events)
        observe(m(vllm.itl), [0.02] * 4)
        assert (await metrics(events)).itl.count == 4
        await asyncio.sleep(0.5)  # longer than the window: the scrape before the gaps is its base no more
        later = await metrics(events)
    assert later.itl.count == 0 and later.itl.p50_s is None and later.window_s >= 0.3  # from the scrape before it


async def test_older_vllm_names_are_read_when_the_new_ones_are_absent():
    old = VllmMetrics(old_names=True)
    server = PageServer(old.registry)
    try:
        old.m(old.kv).set(0.25)
        async with aclosing(source(server).events()) as events:
            await metrics(events)
            observe(old.m(old.itl), [0.03] * 3)
            after = await metrics(events)
        assert after.kv_usage == 0.25 and after.itl.count == 3 and after.not_exposed == SPLIT
    finally:
        server.close()


async def test_sglang_names_and_its_own_buckets(sglang):
    sglang.running.set(12)
    sglang.queue.set(4)
    sglang.token_usage.set(0.8)
    async with aclosing(source(sglang.server).events()) as events:
        hello = decode_event(await next_of(events, "hello"))
        assert hello.scrape.engine == "sglang" and hello.scrape.model_name == LLAMA
        await metrics(events)
        observe(sglang.itl, [0.009] * 3 + [0.012] * 1)  # 3 in (0.008, 0.010], 1 in (0.010, 0.015]
        sglang.generation_tokens.inc(40)
        after = await metrics(events)
    assert (after.running, after.waiting, after.kv_usage) == (12.0, 4.0, 0.8)
    assert after.itl.count == 4
    assert after.itl.p50_s == pytest.approx(0.008 + 0.002 * 2 / 3)  # rank 2 of the 3 in (0.008, 0.010]
    assert after.itl.p99_s == pytest.approx(0.010 + 0.005 * (3.96 - 3) / 1)
    assert after.generation_tokens_per_s * after.window_s == pytest.approx(40)
    assert after.not_exposed == SPLIT


async def test_a_restarted_server_resets_its_counters_and_the_source_says_so(vllm):
    m = vllm.m
    observe(m(vllm.itl), [0.03] * 50)
    m(vllm.generation_tokens).inc(1000)
    async with aclosing(source(vllm.server).events()) as events:
        await metrics(events)
        observe(m(vllm.itl), [0.03] * 10)
        assert (await metrics(events)).itl.count == 10
        restarted = VllmMetrics()  # a new process: every counter from zero
        observe(restarted.m(restarted.itl), [0.06] * 3)
        restarted.m(restarted.generation_tokens).inc(30)
        vllm.server.registry = restarted.registry
        notice = await next_of(events, "error")
        after = await metrics(events)
    assert "counters went back" in notice["reason"] and "restarted" in notice["reason"]
    # as Prometheus's increase(): the 10 before the restart and the 3 after, never a negative count
    assert after.itl.count == 13
    assert after.itl.p99_s == pytest.approx(0.05 + 0.025 * (12.87 - 10) / 3)
    assert after.generation_tokens_per_s >= 0


async def test_metrics_that_disappear_show_as_not_exposed_and_a_model_that_goes(vllm):
    two = VllmMetrics(models=(LLAMA, QWEN))
    server = PageServer(two.registry)
    two.m(two.running, QWEN).set(9)
    try:
        async with aclosing(source(server).events()) as events:
            assert (await metrics(events)).running == 0  # the first model on the page
            bare = CollectorRegistry()
            Gauge("vllm:num_requests_running", "", ["model_name", "engine"], registry=bare).labels(QWEN, "0").set(9)
            server.registry = bare  # only Qwen's running count is left
            hello = decode_event(await next_of(events, "hello"))
            assert hello.scrape.model_name == QWEN and hello.scrape.models == [QWEN]
            after = await metrics(events)
        assert after.running == 9 and after.waiting is None and after.kv_usage is None and after.itl is None
        assert set(after.not_exposed) == {"waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s",
                                          "ttft", "itl", "e2e", *SPLIT}
    finally:
        server.close()


async def test_model_name_picks_one_of_several_and_an_unknown_one_is_named():
    two = VllmMetrics(models=(LLAMA, QWEN))
    server = PageServer(two.registry)
    two.m(two.running, LLAMA).set(1)
    two.m(two.running, QWEN).set(9)
    try:
        async with aclosing(source(server, model_name=QWEN).events()) as events:
            hello = decode_event(await next_of(events, "hello"))
            assert hello.scrape.model_name == QWEN and hello.scrape.models == [LLAMA, QWEN]
            assert (await metrics(events)).running == 9
        src = source(server, model_name="gpt-4")
        task = asyncio.create_task(_drain(src))
        await until(lambda: src.last_error is not None, "the error")
        assert src.last_error == f"no model 'gpt-4' on the page (it has {LLAMA}, {QWEN})"
        assert src.state == "connecting"
        await _stop(src, task)
    finally:
        server.close()


async def test_data_parallel_engines_are_summed_and_kv_use_averaged(vllm):
    vllm.running.labels(LLAMA, "0").set(2)
    vllm.running.labels(LLAMA, "1").set(3)
    vllm.kv.labels(LLAMA, "0").set(0.2)
    vllm.kv.labels(LLAMA, "1").set(0.6)
    vllm.itl.labels(LLAMA, "1")  # vLLM binds each engine's series when it starts (a series new to the window
    # is counted from its first scrape on, as Prometheus's increase() does)
    async with aclosing(source(vllm.server).events()) as events:
        await metrics(events)
        vllm.itl.labels(LLAMA, "0").observe(0.02)
        vllm.itl.labels(LLAMA, "1").observe(0.06)
        after = await metrics(events)
    assert after.running == 5 and after.kv_usage == pytest.approx(0.4)
    assert after.itl.count == 2 and after.itl.p50_s == pytest.approx(0.025)  # rank 1: the last of (0.01, 0.025]


async def test_nan_and_infinities_are_shown_as_such(vllm):
    vllm.m(vllm.running).set(math.nan)
    vllm.m(vllm.waiting).set(math.inf)
    vllm.m(vllm.kv).set(-math.inf)
    async with aclosing(source(vllm.server).events()) as events:
        first = await metrics(events)
        assert (first.running, first.waiting, first.kv_usage) == ("NaN", "+Inf", "-Inf")
        text = generate_latest(vllm.registry).decode()  # a bucket count that is NaN
        vllm.server.body = text.replace(
            f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="{LLAMA}"}} 0.0',
            f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="{LLAMA}"}} NaN').encode()
        assert vllm.server.body.decode() != text
        after = await metrics(events)
    assert after.itl.p50_s == "NaN" and after.ttft.count == 0


async def test_unreachable_then_live_then_gone_with_reason_and_retry_countdown(vllm):
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = PrometheusSource(f"http://127.0.0.1:{port}", interval=0.2)
    task = asyncio.create_task(_drain(src))
    await until(lambda: src.last_error is not None, "a failed try")
    assert src.state == "connecting" and src.last_error.startswith("connection refused")
    assert src.retry_at is not None and src.retry_at > time.monotonic() - 0.05
    await _stop(src, task)

    src = source(vllm.server, interval=0.2)
    seen: list[dict] = []
    task = asyncio.create_task(_drain(src, seen))
    await until(lambda: src.state == "live", "live")
    vllm.server.close()
    await until(lambda: src.state == "reconnecting", "the server gone")
    assert src.last_error.startswith("connection refused") and src.retry_at > time.monotonic()
    await until(lambda: any(e["type"] == "error" for e in seen), "the error event")
    failures = [e for e in seen if e["type"] == "error"]
    assert len(failures) == 1 and failures[0]["reason"].endswith(src.last_error)  # said once, not per try
    first_wait = src.retry_at - time.monotonic()
    await until(lambda: src._failures >= 3, "more tries")
    assert src.retry_at - time.monotonic() > first_wait  # backing off
    await _stop(src, task)


@pytest.mark.parametrize(("status", "body", "content_type", "expected"), [
    (200, b"<!DOCTYPE html><html><body><form>Sign in</form></body></html>", "text/html; charset=utf-8",
     "an HTML page, not Prometheus metrics (a login page, or a proxy in the way?)"),
    (200, b'{"status": "ok"}\n', "application/json", "not Prometheus text ("),
    (200, b"", "text/plain", "an empty page"),
    (200, b"# HELP up Is it up\n# TYPE up gauge\nup 1\nprocess_open_fds 12\n", "text/plain",
     "Prometheus text with 2 series, but none named vllm:, sglang:, pdtop: so not a serving engine pdtop reads"),
    (200, b"vllm:num_requests_running{model_name=\"m\" 3\n", "text/plain", "not valid Prometheus text: "),
    (404, b"Not Found", "text/plain", "HTTP 404 Not Found: no /metrics at this address"),
    (401, b"", "text/plain", "HTTP 401 Unauthorized: the server wants a token (--token)"),
    (503, b"", "text/plain", "HTTP 503 Service Unavailable"),
])
async def test_pages_that_are_not_metrics_say_what_they_are(status, body, content_type, expected):
    server = PageServer()
    server.status, server.body, server.content_type = status, body, content_type
    try:
        src = source(server)
        task = asyncio.create_task(_drain(src))
        await until(lambda: src.last_error is not None, "the error")
        assert src.last_error.startswith(expected) and "\n" not in src.last_error
        assert src.state == "connecting"
        await _stop(src, task)
    finally:
        server.close()


async def test_the_token_goes_as_a_bearer_header_and_a_redirect_is_not_followed():
    server = PageServer()
    server.status, server.body, server.headers = 302, b"", {"Location": "http://127.0.0.1:1/login"}
    try:
        src = source(server, token="s3cret")
        task = asyncio.create_task(_drain(src))
        await until(lambda: src.last_error is not None, "the error")
        await _stop(src, task)
        assert src.last_error == "HTTP 302 Found: redirected to http://127.0.0.1:1/login (a login page?)"
        path, headers = server.requests[0]
        assert path == "/metrics" and headers["Authorization"] == "Bearer s3cret" and len(server.requests) == 1
        server.status = 403
        src = source(server, token="s3cret")
        task = asyncio.create_task(_drain(src))
        await until(lambda: src.last_error is not None, "the error")
        await _stop(src, task)
        assert src.last_error == "HTTP 403 Forbidden: the token was refused"
    finally:
        server.close()


@pytest.mark.parametrize("send_length", [True, False])
async def test_a_10_mb_page_is_not_read_past_the_cap(vllm, send_length):
    page = generate_latest(vllm.registry)
    filler = b"".join(b'vllm:lora_requests_info{running_lora_adapters="a%07d"} 1.0\n' % i for i in range(200_000))
    vllm.server.body = page + filler
    assert len(vllm.server.body) > 10_000_000
    vllm.server.send_length = send_length
    src = source(vllm.server, interval=0.5)
    task = asyncio.create_task(_drain(src))
    await until(lambda: src.last_error is not None, "the error")
    assert src.last_error == "the page is over 4 MiB: pdtop reads at most that much of /metrics"
    await until(lambda: vllm.server.cut_short >= 1, "the server sees the client stop reading")
    await _stop(src, task)


@pytest.mark.parametrize(("how", "expected"), [
    ("delay", "no whole answer within 0.5 s (the server is too slow)"),
    ("trickle", "no whole answer within 0.5 s (the server is too slow)"),
    ("cut", "the server closed the connection in the middle of its answer"),
])
async def test_a_slow_server_or_one_that_stops_mid_answer_is_a_reason_not_a_hang(vllm, how, expected):
    server = vllm.server
    if how == "delay":
        server.delay_s = 2.0
    elif how == "trickle":  # each read comes within the timeout, the whole page never does
        server.trickle_s = 0.05
    else:
        server.cut_at = 100
    src = source(server, timeout=0.5)
    task = asyncio.create_task(_drain(src))
    started = time.monotonic()
    await until(lambda: src.last_error is not None, "the error")
    assert src.last_error == expected and src.state == "connecting"
    assert time.monotonic() - started < 5
    server.delay_s, server.trickle_s, server.cut_at = 0.0, 0.0, None
    await until(lambda: src.state == "live", "live once the server answers")
    await _stop(src, task)


async def test_read_only_says_why():
    src = PrometheusSource("http://127.0.0.1:1")
    with pytest.raises(ControlRefused, match="only reads this server's /metrics"):
        await src.send(PinLevel(1))
    assert src.readonly


def test_urls():
    assert metrics_url("http://gpu-box:8000") == "http://gpu-box:8000/metrics"
    assert metrics_url("http://gpu-box:8000/") == "http://gpu-box:8000/metrics"
    assert metrics_url("https://proxy/vllm/metrics") == "https://proxy/vllm/metrics"
    assert PrometheusSource("http://user:pw@gpu-box:8000").url == "http://gpu-box:8000/metrics"
    for bad in ("ws://127.0.0.1:8765", "gpu-box:8000", "http://"):
        with pytest.raises(ValueError, match="not an HTTP URL"):
            PrometheusSource(bad)
    with pytest.raises(ValueError, match="interval must be positive"):
        PrometheusSource("http://h:1", interval=0)


async def _drain(src: PrometheusSource, into: list | None = None) -> None:
    async for event in src.events():
        if into is not None:
            into.append(event)


async def _stop(src: PrometheusSource, task: asyncio.Task) -> None:
    await src.close()
    await asyncio.wait_for(task, 5)
    assert src.state == "closed"


def test_a_hello_with_neither_engine_nor_scrape_is_refused_and_the_dashboard_keeps_going():
    from pdtop.telemetry.decode import EventError
    from pdtop.telemetry.encode import wire
    from pdtop.telemetry.events import ScrapeTarget
    from pdtop.ui.state import DashboardState

    hello = wire(Hello(client_id="scrape", readonly=True, engine=None,
                       scrape=ScrapeTarget("http://h/metrics", "vllm", LLAMA, [LLAMA], 1.0, 30.0)))
    bad = {**hello, "scrape": None}
    with pytest.raises(EventError, match="'engine', 'scrape' and 'fleet' are all null"):
        decode_event(bad)
    state = DashboardState()
    assert state.ingest(bad) is None and state.invalid == 1 and not state.hello
    assert isinstance(state.ingest(hello), Hello) and state.scrape is not None and state.info.device == "vLLM"
