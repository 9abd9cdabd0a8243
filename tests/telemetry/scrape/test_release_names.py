"""Metric names as SGLang's and vLLM's releases write them (issue 40): older SGLang's TPOT read for the ITL
and shown as TPOT, a histogram without `+Inf` (its `_count` standing in) or without either (`–` and a
note, never NaN), SGLang 0.5.23's newer PD metrics and older SGLang's prefill queue name, and vLLM 0.33's
Mooncake connector beside NIXL. Pages are built with prometheus_client under each release's names
(SGLang 0.5.23's `srt/observability/metrics_collector.py`, vLLM 0.33's `kv_connector/v1/mooncake/stats.py`)."""
from __future__ import annotations

from contextlib import aclosing

from prometheus_client import CollectorRegistry, Gauge, Histogram

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Metrics
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.ui.app import PdtopApp

from ..conftest import next_of, shown
from ..conftest import until_shown as until
from ..disagg_servers import LATENCY_MS_BUCKETS, SglangPdMetrics, VllmMooncakeMetrics, serve
from ..servers import LLAMA, SGLANG_ITL_BUCKETS, PageServer


async def reads(server: PageServer, n: int, between=None) -> list[Metrics]:
    """`n` reads of the page (`between(i)` runs before read i > 0)."""
    source = PrometheusSource(server.url, interval=0.05, window_s=600.0)
    out: list[Metrics] = []
    try:
        async with aclosing(source.events()) as events:
            for i in range(n):
                if i and between is not None:
                    between(i)
                out.append(decode_event(await next_of(events, "metrics")))
    finally:
        await source.close()
    return out


def older_sglang() -> tuple[CollectorRegistry, Histogram]:
    """An SGLang from before `inter_token_latency_seconds`: its tokenizer's TPOT histogram, observed at every
    streamed chunk as the request's mean gap since its first token."""
    r = CollectorRegistry()
    labels = {"model_name": LLAMA}
    Gauge("sglang:num_running_reqs", "running", list(labels), registry=r).labels(**labels).set(3)
    tpot = Histogram("sglang:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                     list(labels), buckets=SGLANG_ITL_BUCKETS, registry=r).labels(**labels)
    return r, tpot


async def test_older_sglangs_tpot_is_read_for_the_itl_and_shown_as_tpot():
    registry, tpot = older_sglang()
    server = PageServer(registry)
    try:
        got = await reads(server, 2, lambda i: [tpot.observe(0.012) for _ in range(10)])
        m = got[-1]
        assert "itl" not in m.not_exposed and m.itl_metric == "sglang:time_per_output_token_seconds"
        assert m.itl.count == 10 and 0.010 < m.itl.p50_s <= 0.015
        app = PdtopApp(PrometheusSource(server.url, interval=0.1), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
            requests = shown(app, "RequestsPanel")
            assert "TPOT" in requests and "ITL" not in requests and "not exposed" in requests  # (TTFT, E2E)
            assert "TPOT p50" in shown(app, "StepTimePanel")
            await app.source.close()
    finally:
        server.close()


ITL = "vllm:inter_token_latency_seconds"


def vllm_excerpt(counts: tuple[int, ...], inf: bool, total: bool) -> bytes:
    """A vLLM page's ITL histogram cut short: its finite buckets, with or without `+Inf` and `_count`."""
    lines = ['vllm:num_requests_running{model_name="m",engine="0"} 2.0']
    bounds = ("0.01", "0.025", "0.05")
    lines += [f'{ITL}_bucket{{model_name="m",engine="0",le="{b}"}} {c}' for b, c in zip(bounds, counts, strict=True)]
    if inf:
        lines.append(f'{ITL}_bucket{{model_name="m",engine="0",le="+Inf"}} {counts[-1]}')
    if total:
        lines.append(f'{ITL}_count{{model_name="m",engine="0"}} {counts[-1]}')
    return ("\n".join(lines) + "\n").encode()


async def test_a_histogram_without_inf_reads_its_count_and_without_either_shows_a_dash_with_a_note():
    server = PageServer()
    try:
        for inf, total in ((True, False), (False, True), (False, False)):
            server.pages = [vllm_excerpt((0, 0, 0), inf, total), vllm_excerpt((2, 6, 8), inf, total)]
            server.requests.clear()
            m = (await reads(server, 2))[-1]
            if inf or total:
                assert m.itl.count == 8 and m.itl.note is None and 0.01 < m.itl.p50_s < 0.025
            else:
                assert m.itl.count is None and (m.itl.p50_s, m.itl.p99_s) == (None, None)
                assert "no +Inf bucket and no _count" in m.itl.note
        app = PdtopApp(PrometheusSource(server.url, interval=0.1), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
            requests = shown(app, "RequestsPanel")
            assert "ITL  –  no +Inf bucket and no _count" in requests and "NaN" not in requests
            await app.source.close()
    finally:
        server.close()


async def test_sglang_pd_metrics_newer_and_older():
    decode = SglangPdMetrics("decode")
    r, labels = decode.registry, decode.labels
    Gauge("sglang:num_decode_host_receive_queue_reqs", "host receive", list(labels), registry=r).labels(**labels).set(4)
    bootstrap_ms = Histogram("sglang:kv_transfer_bootstrap_ms", "bootstrap", list(labels), registry=r,
                             buckets=LATENCY_MS_BUCKETS).labels(**labels)
    alloc_ms = Histogram("sglang:kv_transfer_alloc_ms", "alloc", list(labels), registry=r,
                         buckets=LATENCY_MS_BUCKETS).labels(**labels)
    serve(decode)
    older = CollectorRegistry()  # before the bootstrap queue's rename
    Gauge("sglang:num_prefill_prealloc_queue_reqs", "prefill bootstrap queue", ["model_name"],
          registry=older).labels(LLAMA).set(6)
    Gauge("sglang:num_running_reqs", "running", ["model_name"], registry=older).labels(LLAMA).set(1)
    old_server = PageServer(older)
    try:
        def observe(_i: int) -> None:
            for v in (3, 4, 30):
                bootstrap_ms.observe(v)
            alloc_ms.observe(40)
        d = (await reads(decode.server, 2, observe))[-1].disagg
        assert d.decode_host_receive_queue == 4 and 2 < d.kv_bootstrap_ms <= 5 and 25 < d.kv_alloc_ms <= 50
        old = (await reads(old_server, 1))[-1].disagg
        assert old.prefill_bootstrap_queue == 6 and "prefill_bootstrap_queue" not in old.absent
    finally:
        decode.server.close()
        old_server.close()


async def test_vllms_mooncake_connector_beside_nixl():
    mooncake = serve(VllmMooncakeMetrics())
    try:
        def observe(_i: int) -> None:
            for _ in range(4):
                mooncake.xfer_time.observe(0.004)
                mooncake.bytes.observe(40e6)
            mooncake.failed.inc()
        d = (await reads(mooncake.server, 2, observe))[-1].disagg
        assert d.transfer_metrics == "mooncake" and d.transfer_failures == 1
        assert 1 < d.kv_transfer_latency_ms <= 5 and d.kv_transfer_speed_gb_s == 40e6 * 4 / (0.004 * 4) / 1e9
        assert 2**24 / 1e6 < d.kv_transfer_mb <= 2**26 / 1e6  # in the bucket of 40 MB
    finally:
        mooncake.server.close()
