"""Real HTTP servers on loopback serving Prometheus text, built with prometheus_client, with the metric
names, labels and buckets of vLLM (`vllm/v1/metrics/loggers.py`) and SGLang
(`python/sglang/srt/metrics/collector.py`, `TokenizerMetricsCollector`); the names are those of both
projects' metrics documentation. A test sets values through the metric objects, as the engines do."""
from __future__ import annotations

import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

disable_created_metrics()  # neither engine's page has `_created` series

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
VLLM_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)


class VllmMetrics:
    """vLLM's V1 metrics (labels `model_name`, `engine`) for `models`. `old_names`: a vLLM from before
    `kv_cache_usage_perc` and `inter_token_latency_seconds` (it has `gpu_cache_usage_perc` and
    `time_per_output_token_seconds`). Use `.m(metric, model)` for a metric's child of engine 0."""

    def __init__(self, models: tuple[str, ...] = (LLAMA,), old_names: bool = False) -> None:
        self.registry = r = CollectorRegistry()
        self.models = models
        labels = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                             registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
                             registry=r)
        kv_name = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
        self.kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries.", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                   labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=r)
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
                                     buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000), registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=VLLM_TTFT_BUCKETS, registry=r)
        itl_name = "vllm:time_per_output_token_seconds" if old_names else "vllm:inter_token_latency_seconds"
        self.itl = Histogram(itl_name, "Histogram of inter-token latency in seconds.", labels,
                             buckets=VLLM_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=VLLM_REQUEST_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.",
                               labels, buckets=VLLM_REQUEST_LATENCY_BUCKETS, registry=r)
        for model in models:  # vLLM binds every child when it starts, so each series is on the page from then
            for metric in (self.running, self.waiting, self.kv, self.prefix_queries, self.preemptions,
                           self.prompt_tokens, self.generation_tokens, self.prompt_hist, self.ttft, self.itl,
                           self.e2e, self.queue):
                metric.labels(model, "0")
            for reason in ("stop", "length", "abort"):
                self.success.labels(model, "0", reason)

    def m(self, metric: Any, model: str = LLAMA) -> Any:
        return metric.labels(model, "0")


class SglangMetrics:
    """SGLang's metrics as its two collectors export them: the scheduler's gauges (`SchedulerMetricsCollector`,
    labels `model_name`, `engine_type`, `tp_rank`, `pp_rank`) and the tokenizer manager's counters and
    histograms (`TokenizerMetricsCollector`, labels `model_name`, `engine_type`)."""

    def __init__(self, model: str = LLAMA, engine_type: str = "unified") -> None:
        self.registry = r = CollectorRegistry()
        self.labels = {"model_name": model, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0"}
        tokenizer_labels = {"model_name": model, "engine_type": engine_type}

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, list(self.labels), registry=r).labels(**self.labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, list(tokenizer_labels), registry=r).labels(**tokenizer_labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, list(tokenizer_labels), buckets=buckets, registry=r).labels(**tokenizer_labels)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
        self.requests = counter("sglang:num_requests_total", "Number of requests processed.")
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              SGLANG_TTFT_BUCKETS)
        self.itl = histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             SGLANG_ITL_BUCKETS)
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             SGLANG_E2E_BUCKETS)


class PageServer:
    """`GET` on any path answers with the registry's text (as prometheus_client's exposition does), or
    with `body` / `status` / `content_type` / `headers` when a test sets them. `registry` may be swapped
    (a restarted server). `requests` keeps each request's path and headers; `cut_short` counts answers
    the client stopped reading."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry
        self.body: bytes | None = None
        self.pages: list[bytes] = []  # served one per request, the last one again after them
        self.status = 200
        self.content_type = CONTENT_TYPE_LATEST
        self.headers: dict[str, str] = {}
        self.send_length = True
        self.delay_s = 0.0  # before answering
        self.trickle_s = 0.0  # between chunks of 64 bytes (a server too slow to finish)
        self.cut_at: int | None = None  # close the connection after this many bytes of the body
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.cut_short = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append((self.path, dict(self.headers)))
                time.sleep(server.delay_s)
                if server.pages:
                    body = server.pages[min(len(server.requests), len(server.pages)) - 1]
                else:
                    body = server.body if server.body is not None else generate_latest(server.registry)
                self.send_response(server.status)
                self.send_header("Content-Type", server.content_type)
                for k, v in server.headers.items():
                    self.send_header(k, v)
                if server.send_length:
                    self.send_header("Content-Length", str(len(body)))
                else:
                    self.close_connection = True
                self.end_headers()
                step = 64 if server.trickle_s else 1 << 16
                end = len(body) if server.cut_at is None else server.cut_at
                try:
                    for i in range(0, end, step):
                        self.wfile.write(body[i:min(i + step, end)])
                        if server.trickle_s:
                            self.wfile.flush()
                            time.sleep(server.trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    server.cut_short += 1
                if server.cut_at is not None:
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="test-metrics-server",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


class RawServer:
    """A loopback TCP server that answers each connection's GET /metrics with raw bytes: the next of
    `answers`, then `good` for ever (each on a connection of its own, closed after it); other paths get 404.
    For answers no HTTP library would write: broken framing, escapes in a status line or a header."""

    def __init__(self, answers: list[bytes], good: bytes) -> None:
        self.answers, self.good, self.served = list(answers), good, 0
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                if not data.startswith(b"GET /metrics "):
                    self.request.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                answer = server.answers[server.served] if server.served < len(server.answers) else server.good
                server.served += 1
                try:
                    self.request.sendall(answer)
                except OSError:
                    pass

        self.tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.tcp.daemon_threads = True
        self._thread = threading.Thread(target=self.tcp.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.tcp.server_address[1]}"

    def close(self) -> None:
        self.tcp.shutdown()
        self.tcp.server_close()
        self._thread.join(5)


def http_answer(body: bytes, head: bytes = b"HTTP/1.1 200 OK", headers: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes its connection."""
    return (head + b"\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n" + headers +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)
