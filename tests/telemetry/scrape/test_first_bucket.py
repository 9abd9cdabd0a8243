"""Issue 25 item 7: pdtop's own ITL buckets resolve single-digit-ms gaps, and a percentile in a histogram's
lowest bucket shows as "< BOUND" rather than an interpolation from 0."""
from __future__ import annotations

from contextlib import aclosing

from prometheus_client import CollectorRegistry, Gauge, Histogram

from pdtop.api.metrics import ITL_BUCKETS
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.ui.app import PdtopApp

from ..conftest import next_of, shown
from ..conftest import until_shown as until
from ..servers import PageServer


async def test_pdtops_itl_buckets_resolve_an_8_ms_gap():
    registry = CollectorRegistry()
    Gauge("pdtop:num_requests_running", "", ["model_name"], registry=registry).labels("m").set(1)
    itl = Histogram("pdtop:inter_token_latency_seconds", "", ["model_name"], buckets=ITL_BUCKETS,
                    registry=registry).labels("m")
    server = PageServer(registry)
    try:
        src = PrometheusSource(server.url, interval=0.1, window_s=600)
        async with aclosing(src.events()) as events:
            await next_of(events, "metrics")
            for _ in range(10):
                itl.observe(0.0083)
            m = decode_event(await next_of(events, "metrics"))
        assert m.itl.count == 10 and 0.008 <= m.itl.p50_s <= 0.009  # with a first bucket of 10 ms: 5 ms
    finally:
        server.close()


async def test_a_percentile_in_the_first_bucket_is_shown_as_below_it(vllm):
    app = PdtopApp(PrometheusSource(vllm.server.url, interval=0.1, window_s=600.0), interval_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.scrapes >= 1, "the first read")
        for v in [0.004] * 8 + [0.03] * 2:  # vLLM's first ITL bucket is 10 ms: p50 is in it, p99 above it
            vllm.m(vllm.itl).observe(v)
        await until(pilot, lambda: app.state.scrape.latest.itl.count == 10, "the gaps read")
        assert app.state.scrape.latest.itl.first_bound_s == 0.01
        requests = shown(app, "RequestsPanel")
        assert "ITL  p50 < 10.0 ms" in requests and "p99 < " not in requests
        assert "ITL p50 < 10.0 ms  p99 " in shown(app, "StepTimePanel")
