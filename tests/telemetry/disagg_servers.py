"""Loopback pages of a disaggregated deployment, built with prometheus_client under SGLang's and vLLM's
names: SGLang's PD-disaggregation metrics (`python/sglang/srt/observability/metrics_collector.py`: the
queues as gauges, KV transfer latency / speed / size as histograms in newer SGLang and as gauges of the
same names in older SGLang, the failure counters), with SGLang's `engine_type` label, and vLLM's NIXL
connector metrics (`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`,
`vllm:nixl_num_failed_transfers`); and an SGLang Model Gateway's `GET /workers` listing."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, generate_latest

from .servers import LLAMA, PageServer, SglangMetrics, VllmMetrics

LATENCY_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
SIZE_MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)


class SglangPdMetrics(SglangMetrics):
    """An SGLang prefill or decode server's page: `engine_type` = role; `old_gauges`: an SGLang whose KV
    transfer figures are gauges."""

    def __init__(self, role: str, old_gauges: bool = False, model: str = LLAMA) -> None:
        super().__init__(model, engine_type=role)
        r, labels = self.registry, self.labels

        def gauge(name: str) -> Any:
            return Gauge(name, name, list(labels), registry=r).labels(**labels)

        def counter(name: str) -> Any:
            return Counter(name, name, list(labels), registry=r).labels(**labels)

        def transfer(name: str, buckets: tuple[float, ...]) -> Any:
            if old_gauges:
                return Gauge(name, name, list(labels), registry=r).labels(**labels)
            return Histogram(name, name, list(labels), buckets=buckets, registry=r).labels(**labels)

        self.bootstrap_queue = gauge("sglang:num_prefill_bootstrap_queue_reqs")
        self.inflight_queue = gauge("sglang:num_prefill_inflight_queue_reqs")
        self.prealloc_queue = gauge("sglang:num_decode_prealloc_queue_reqs")
        self.transfer_queue = gauge("sglang:num_decode_transfer_queue_reqs")
        self.latency_ms = transfer("sglang:kv_transfer_latency_ms", LATENCY_MS_BUCKETS)
        self.speed_gb_s = transfer("sglang:kv_transfer_speed_gb_s", SPEED_BUCKETS)
        self.total_mb = transfer("sglang:kv_transfer_total_mb", SIZE_MB_BUCKETS)
        self.bootstrap_failed = counter("sglang:num_bootstrap_failed_reqs")
        self.transfer_failed = counter("sglang:num_transfer_failed_reqs")
        self.retries = counter("sglang:num_prefill_retries")


class VllmNixlMetrics(VllmMetrics):
    """A vLLM server with the NIXL KV connector's metrics."""

    def __init__(self) -> None:
        super().__init__()
        r, labels = self.registry, ["model_name", "engine"]
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds", "Transfer duration", labels, registry=r,
                                   buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)).labels(LLAMA, "0")
        self.bytes = Histogram("vllm:nixl_bytes_transferred", "Bytes per transfer", labels, registry=r,
                               buckets=(2**20, 2**24, 2**26, 2**28, 2**30, 2**34)).labels(LLAMA, "0")
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Failed transfers", labels,
                              registry=r).labels(LLAMA, "0")


class VllmMooncakeMetrics(VllmMetrics):
    """A vLLM server with the Mooncake KV connector's metrics (vLLM 0.33's `mooncake/stats.py`)."""

    def __init__(self) -> None:
        super().__init__()
        r, labels = self.registry, ["model_name", "engine"]
        self.xfer_time = Histogram("vllm:mooncake_xfer_time_seconds", "Transfer duration", labels, registry=r,
                                   buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)).labels(LLAMA, "0")
        self.bytes = Histogram("vllm:mooncake_bytes_transferred", "Bytes per transfer", labels, registry=r,
                               buckets=(2**20, 2**24, 2**26, 2**28, 2**30, 2**34)).labels(LLAMA, "0")
        self.failed = Counter("vllm:mooncake_num_failed_transfers", "Failed transfers", labels,
                              registry=r).labels(LLAMA, "0")


def serve(metrics: Any) -> Any:
    metrics.server = PageServer(metrics.registry)
    return metrics


class GatewayServer:
    """An SGLang Model Gateway on loopback: `GET /workers` (its WorkerListResponse; a DP-aware worker listed
    once per rank as `URL@rank`, a gRPC one as `grpc://...`) and `GET /engine_metrics`, each worker's page as
    sgl-model-gateway's `metrics_aggregator.rs` writes it: every `:` of the page made `_`, and a
    `worker_addr` label with the worker's URL. `requests` keeps each request's path and headers;
    `listing` replaces the listing's bytes; `drip_s` sends the listing a byte at a time."""

    def __init__(self, workers: list[tuple[str, str]], engine_pages: dict[str, Any] | None = None) -> None:
        self.workers = workers  # (url, worker_type)
        self.engine_pages = engine_pages or {}  # worker_addr -> registry
        self.listing: bytes | None = None
        self.drip_s = 0.0
        self.requests: list[tuple[str, dict[str, str]]] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gateway.requests.append((self.path, dict(self.headers)))
                if self.path == "/workers":
                    body = gateway.listing if gateway.listing is not None else gateway.listing_body()
                elif self.path == "/engine_metrics" and gateway.engine_pages:
                    body = gateway.engine_metrics()
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if self.path == "/workers" else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if gateway.drip_s:
                        for i in range(len(body)):
                            self.wfile.write(body[i:i + 1])
                            self.wfile.flush()
                            time.sleep(gateway.drip_s)
                    else:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def listing_body(self) -> bytes:
        listed = [{"id": f"w{i}", "url": url, "model_id": LLAMA, "priority": 50, "cost": 1.0,
                   "worker_type": kind, "is_healthy": True, "load": 0,
                   "connection_mode": "grpc" if url.startswith("grpc://") else "http"}
                  for i, (url, kind) in enumerate(self.workers)]
        by_type = {k: sum(kind == k for _, kind in self.workers) for k in ("regular", "prefill", "decode")}
        return json.dumps({"workers": listed, "total": len(listed),
                           "stats": {"total_workers": len(listed), "healthy_workers": len(listed),
                                     "total_models": 1, "total_load": 0, "by_type": by_type}}).encode()

    def engine_metrics(self) -> bytes:
        lines = []
        for addr, registry in self.engine_pages.items():
            for line in generate_latest(registry).decode().replace(":", "_").splitlines():
                if line.startswith("#") or not line:
                    continue
                name, brace, rest = line.partition("{")
                if brace:
                    label = ',worker_addr="' + addr + '"}'
                    lines.append(name + "{" + rest.replace("}", label, 1))
                else:
                    name, _, value = line.partition(" ")
                    lines.append(f'{name}{{worker_addr="{addr}"}} {value}')
        return ("\n".join(lines) + "\n").encode()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
