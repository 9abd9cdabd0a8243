"""Dashboard CPU while attached to a /metrics page: process CPU seconds per wall second of the real app
(headless, `App.run_test`) polling a vLLM-named page of about 2,000 series every --interval seconds.

The page is served by another process (prometheus_client's registry and exposition, vLLM's names,
labels and buckets for --models models, so every series is one pdtop reads); it changes its values
twice a second, so every read brings new figures and a repaint. Also shown: the page's size and series,
the reads made, and what one read costs alone (parse + figures, no UI), averaged over 50 reads.

    .venv/bin/python bench/scrape_bench.py [--seconds 20] [--interval 1] [--models 16]
    .venv/bin/python bench/scrape_bench.py --fleet 16 [--seconds 20] [--interval 1]

With --fleet N: the dashboard watches N SGLang servers (`pdtop attach URL URL ...`), half prefill and
half decode (SGLang's names, `engine_type` label, buckets and PD-disaggregation metrics), each on its
own port of the other process, every --interval seconds, with the fleet's table on screen.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0)


def build(models: int) -> tuple[Any, list[Any], list[Any], list[Any], list[tuple[str, str]]]:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

    disable_created_metrics()
    r = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = [Gauge(f"vllm:{n}", n, labels, registry=r) for n in
              ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")]
    counters = [Counter(f"vllm:{n}", n, labels, registry=r) for n in ("prompt_tokens", "generation_tokens")]
    hists = [Histogram(f"vllm:{n}", n, labels, buckets=b, registry=r) for n, b in
             (("time_to_first_token_seconds", TTFT), ("inter_token_latency_seconds", ITL),
              ("e2e_request_latency_seconds", E2E), ("request_queue_time_seconds", E2E),
              ("request_prefill_time_seconds", E2E))]
    names = [(f"org/model-{i}", "0") for i in range(models)]
    return r, gauges, counters, hists, names


def serve(port_out: Any, models: int) -> None:
    """The page's process: a ThreadingHTTPServer on loopback, values changed twice a second."""
    import random
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    registry, gauges, counters, hists, names = build(models)
    lock = threading.Lock()

    def change() -> None:
        rng = random.Random(0)
        while True:
            with lock:
                for name in names:
                    for g in gauges:
                        g.labels(*name).set(rng.random())
                    for c in counters:
                        c.labels(*name).inc(rng.randint(0, 500))
                    for h in hists:
                        for _ in range(5):
                            h.labels(*name).observe(rng.expovariate(20))
            time.sleep(0.5)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=change, daemon=True).start()
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
              0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_LONG = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)


def build_sglang(role: str) -> tuple[Any, list[Any], list[Any], list[Any]]:
    """One SGLang PD server's page: the scheduler's gauges, the tokenizer's counters and histograms, and
    the disaggregation queues, KV transfer histograms and failure counters."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    r = CollectorRegistry()
    labels = {"model_name": "org/model", "engine_type": role, "tp_rank": "0", "pp_rank": "0"}
    tok = {"model_name": "org/model", "engine_type": role}
    gauges = [Gauge(f"sglang:{n}", n, list(labels), registry=r).labels(**labels) for n in
              ("num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput", "num_used_tokens",
               "num_prefill_bootstrap_queue_reqs", "num_prefill_inflight_queue_reqs",
               "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs")]
    counters = [Counter(f"sglang:{n}", n, list(tok), registry=r).labels(**tok) for n in
                ("prompt_tokens", "generation_tokens", "num_requests")]
    counters += [Counter(f"sglang:{n}", n, list(labels), registry=r).labels(**labels) for n in
                 ("num_bootstrap_failed_reqs", "num_transfer_failed_reqs", "num_prefill_retries")]
    hists = [Histogram(f"sglang:{n}", n, list(tok), buckets=b, registry=r).labels(**tok) for n, b in
             (("time_to_first_token_seconds", SGLANG_LONG), ("inter_token_latency_seconds", SGLANG_ITL),
              ("e2e_request_latency_seconds", SGLANG_LONG))]
    hists += [Histogram(f"sglang:{n}", n, list(labels), buckets=b, registry=r).labels(**labels) for n, b in
              (("kv_transfer_latency_ms", (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)),
               ("kv_transfer_speed_gb_s", (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)),
               ("kv_transfer_total_mb", (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)))]
    return r, gauges, counters, hists


def serve_fleet(port_out: Any, n: int) -> None:
    """N SGLang pages, each on its own port (HTTP/1.1 keep-alive), values changed twice a second."""
    import random
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import disable_created_metrics, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    disable_created_metrics()
    pages = [build_sglang("prefill" if i % 2 == 0 else "decode") for i in range(n)]
    lock = threading.Lock()

    def change() -> None:
        rng = random.Random(0)
        while True:
            with lock:
                for _, gauges, counters, hists in pages:
                    for g in gauges:
                        g.set(rng.randint(0, 40))
                    for c in counters:
                        c.inc(rng.randint(0, 500))
                    for h in hists:
                        for _ in range(5):
                            h.observe(rng.expovariate(20))
            time.sleep(0.5)

    ports = []
    for registry, *_ in pages:
        def handler(registry: Any = registry) -> type[BaseHTTPRequestHandler]:
            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn (SGLang's, vLLM's server) does

                def do_GET(self) -> None:
                    with lock:
                        body = generate_latest(registry)
                    try:
                        self.send_response(200)
                        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    except (BrokenPipeError, ConnectionResetError):  # the dashboard went at the end
                        self.close_connection = True

                def log_message(self, *args: Any) -> None:
                    pass
            return Handler

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler())
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        ports.append(httpd.server_address[1])
    threading.Thread(target=change, daemon=True).start()
    port_out.put(ports)
    threading.Event().wait()


async def fleet_dashboard(urls: list[str], seconds: float, interval: float) -> tuple[float, int, int]:
    from pdtop.telemetry.sources.fleet import FleetSource
    from pdtop.ui.app import PdtopApp
    from pdtop.ui.screens.fleet import FleetScreen

    source = FleetSource([(u, None) for u in urls], interval=interval)
    app = PdtopApp(source)
    async with app.run_test(size=(160, 48)) as pilot:
        while not (isinstance(app.screen, FleetScreen) and app.state.fleet is not None and app.state.fleet.servers
                   and all(s.reads for s in app.state.fleet.servers)):
            await pilot.pause(0.1)
        reads0 = sum(m.source.scrapes for m in source.members)
        c0, t0 = cpu(), time.monotonic()
        await pilot.pause(seconds)
        c1, t1 = cpu(), time.monotonic()
        reads = sum(m.source.scrapes for m in source.members) - reads0
        return (c1 - c0) / (t1 - t0), reads, len(urls)


def cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


async def dashboard(url: str, seconds: float, interval: float) -> tuple[float, int, int]:
    from pdtop.telemetry.sources.prometheus import PrometheusSource
    from pdtop.ui.app import PdtopApp

    app = PdtopApp(PrometheusSource(url, interval=interval))
    async with app.run_test(size=(160, 48)) as pilot:
        while app.state.scrape is None or app.state.scrape.latest is None:
            await pilot.pause(0.1)
        c0, t0, reads0 = cpu(), time.monotonic(), app.state.scrape.scrapes
        await pilot.pause(seconds)
        c1, t1 = cpu(), time.monotonic()
        return (c1 - c0) / (t1 - t0), app.state.scrape.scrapes - reads0, app.repaints


def one_read_cost(url: str, reads: int = 50) -> tuple[float, int, int]:
    """Seconds of CPU per read without the UI (parse + figures), the page's bytes and its series."""
    import httpx

    from pdtop.telemetry.scrape.figures import figures
    from pdtop.telemetry.scrape.page import read_page
    from pdtop.telemetry.scrape.window import Window

    text = httpx.get(url + "/metrics").text
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    window = Window(30.0)
    c0 = cpu()
    for i in range(reads):
        page = read_page(text)
        figures(page, page.models[0], window, float(i))
    return (cpu() - c0) / reads, len(text), series


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--models", type=int, default=16, help="models on the page (about 125 series each)")
    ap.add_argument("--fleet", type=int, metavar="N", help="watch N SGLang PD servers instead (pdtop attach URL ...)")
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    ctx = multiprocessing.get_context("spawn")
    if args.fleet:
        ports_q = ctx.Queue()
        server = ctx.Process(target=serve_fleet, args=(ports_q, args.fleet), daemon=True)
        server.start()
        try:
            urls = [f"http://127.0.0.1:{p}" for p in ports_q.get(timeout=60)]
            per_read, size, series = one_read_cost(urls[0])
            print(f"each page: {series} series, {size / 1024:.1f} KiB; one read without the UI: "
                  f"{per_read * 1e3:.2f} ms CPU")
            share, reads, n = asyncio.run(fleet_dashboard(urls, args.seconds, args.interval))
            print(f"dashboard watching {n} servers, each read every {args.interval:g} s, for {args.seconds:g} s: "
                  f"{share * 100:.1f}% of a core ({reads} reads)")
        finally:
            server.terminate()
            server.join(5)
        return
    port_q = ctx.Queue()
    server = ctx.Process(target=serve, args=(port_q, args.models), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port_q.get(timeout=30)}"
        per_read, size, series = one_read_cost(url)
        print(f"page: {series} series, {size / 1024:.0f} KiB; one read without the UI: {per_read * 1e3:.1f} ms CPU")
        share, reads, repaints = asyncio.run(dashboard(url, args.seconds, args.interval))
        print(f"dashboard polling every {args.interval:g} s for {args.seconds:g} s: {share * 100:.1f}% of a core "
              f"({reads} reads, {repaints} repaints)")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
