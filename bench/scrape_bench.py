"""Dashboard CPU while attached to a /metrics page: process CPU seconds per wall second of the real app
(headless, `App.run_test`) polling a vLLM-named page of about 2,000 series every --interval seconds.

The page is served by another process (prometheus_client's registry and exposition, vLLM's names,
labels and buckets for --models models, so every series is one pdtop reads); it changes its values
twice a second, so every read brings new figures and a repaint. Also shown: the page's size and series,
the reads made, and what one read costs alone (parse + figures, no UI), averaged over 50 reads.

    .venv/bin/python bench/scrape_bench.py [--seconds 20] [--interval 1] [--models 16]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0)


def build(models: int):
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


def serve(port_out, models: int) -> None:
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

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=change, daemon=True).start()
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


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
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    ctx = multiprocessing.get_context("spawn")
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
