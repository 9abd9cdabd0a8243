"""Prometheus metrics of the engine, under vLLM's names with the prefix `pdtop:` (docs/metrics.md).

An engine sink feeds them on the engine thread (prometheus_client is thread-safe); `/metrics`
renders them. They cover every request the engine runs, whatever its source, as vLLM's do.
Each metric has vLLM's `model_name` label.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pdtop.engine.records import ConfigChange, KvTransfer, RequestRecord, RoundRecord

if TYPE_CHECKING:  # annotations only
    from pdtop.engine.engine import Engine
    from pdtop.engine.sinks import Record

# vLLM's buckets (seconds) for TTFT and E2E; ITL's start at 1 ms and are as fine as SGLang's up to 40 ms, so
# single-digit-ms gaps (a GPU's decode step) resolve (vLLM's first ITL bucket is 10 ms)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.0125, 0.015, 0.0175, 0.02,
               0.025, 0.03, 0.035, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
class SplitCollector(Collector):
    """`split_level`, `prefill_units` and `decode_units` of one round: set as one tuple on the engine
    thread and read once per scrape, so a scrape never mixes two rounds' split (three gauges set one
    after another could be read between the sets)."""

    DOCS = (("split_level", "Split level of the last round (index into the levels)"),
            ("prefill_units", "Units (SMs or cores) given to prefill in the last round"),
            ("decode_units", "Units (SMs or cores) given to decode in the last round"))

    def __init__(self, model: str):
        self.model = model
        self.split: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        split = self.split  # one read: the three values of one round
        for (name, doc), value in zip(self.DOCS, split, strict=True):
            family = GaugeMetricFamily(f"pdtop:{name}", doc, labels=["model_name"])
            family.add_metric([self.model], value)
            yield family


SUCCESS_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}  # vLLM's label values


class EngineMetrics:
    """The registry `/metrics` serves, kept up to date by `sink` (register it with `engine.add_sink`)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        disable_created_metrics()  # no `_created` series, as vLLM's output
        self.registry = CollectorRegistry()
        model = engine.model_name
        r, m = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"pdtop:{name}", doc, m, registry=r).labels(model)

        self.ttft = Histogram("pdtop:time_to_first_token_seconds", "Time to first token, seconds", m,
                              buckets=TTFT_BUCKETS, registry=r).labels(model)
        self.itl = Histogram("pdtop:inter_token_latency_seconds", "Gap between consecutive tokens of a request",
                             m, buckets=ITL_BUCKETS, registry=r).labels(model)
        self.e2e = Histogram("pdtop:e2e_request_latency_seconds", "Arrival to last token of a finished request",
                             m, buckets=E2E_BUCKETS, registry=r).labels(model)
        # TPOT: older vLLM's name for each token's gap (which its dashboards and autoscaler triggers read), and
        # vLLM 0.33's per-request mean gap after the first token
        self.tpot = Histogram("pdtop:time_per_output_token_seconds", "Time per output token: each gap between "
                              "consecutive tokens of a request (older vLLM's name for the ITL)", m,
                              buckets=ITL_BUCKETS, registry=r).labels(model)
        self.request_tpot = Histogram("pdtop:request_time_per_output_token_seconds", "Each finished request's "
                                      "mean time per output token after its first", m, buckets=ITL_BUCKETS,
                                      registry=r).labels(model)
        self.running = gauge("num_requests_running", "Requests prefilling or decoding")
        self.waiting = gauge("num_requests_waiting", "Requests waiting for prefill")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent")
        self.prompt_tokens = Counter("pdtop:prompt_tokens", "Prompt tokens prefilled", m, registry=r).labels(model)
        self.generation_tokens = Counter("pdtop:generation_tokens", "Tokens generated", m, registry=r).labels(model)
        self.success = Counter("pdtop:request_success", "Finished requests, by finish reason",
                               [*m, "finished_reason"], registry=r)
        self.split = SplitCollector(model)
        r.register(self.split)
        self.decode_bs_divisor = gauge("decode_bs_divisor", "Decode requests per level step (pdmux config)")
        # disagg, under SGLang's PD-disaggregation names (0 under the other policies)
        self.prealloc = gauge("num_decode_prealloc_queue_reqs", "disagg: requests waiting for decode KV slots")
        self.transfer_queue = gauge("num_decode_transfer_queue_reqs",
                                    "disagg: requests with decode slots, their KV not there yet")
        self.inflight = gauge("num_prefill_inflight_queue_reqs", "disagg: prefilled requests whose KV is on the link")
        self.kv_transfer = Histogram("pdtop:kv_transfer_latency_seconds", "disagg: one prompt's KV over the link",
                                     m, buckets=TTFT_BUCKETS, registry=r).labels(model)
        self.kv_transfer_bytes = Counter("pdtop:kv_transfer_bytes", "disagg: KV bytes sent over the link", m,
                                         registry=r).labels(model)
        self.policy = Info("pdtop:policy", "Scheduling policy", m, registry=r).labels(model)
        self._model = model
        self._on_config()

    def sink(self, rec: Record) -> None:
        """Engine thread: one record in."""
        if isinstance(rec, RoundRecord) and rec.instance != "prefill":  # disagg: the decode instance's
            self.running.set(rec.running)
            self.waiting.set(rec.waiting)
            self.kv_usage.set(rec.kv_used_tokens / rec.kv_capacity_tokens if rec.kv_capacity_tokens else 0.0)
            self.generation_tokens.inc(rec.tokens_emitted)
            self.split.split = (rec.level, rec.prefill_units, rec.decode_units)
            d = rec.disagg
            self.prealloc.set(d.reserving if d else 0)
            self.transfer_queue.set(d.prefill_queue + d.prefilling + d.transfers if d else 0)
            self.inflight.set(d.transfers if d else 0)
        elif isinstance(rec, KvTransfer):
            self.kv_transfer.observe(rec.end - rec.start)
            self.kv_transfer_bytes.inc(rec.bytes)
        elif isinstance(rec, RequestRecord):
            if rec.kind == "first_token":
                self.prompt_tokens.inc(rec.prompt_tokens)
                if rec.ttft_s is not None:
                    self.ttft.observe(rec.ttft_s)
            elif rec.kind == "finish" and rec.finish_reason in SUCCESS_REASONS:
                self.success.labels(self._model, SUCCESS_REASONS[rec.finish_reason]).inc()
                for gap in rec.itls_s:
                    self.itl.observe(gap)
                    self.tpot.observe(gap)
                if rec.itls_s:
                    self.request_tpot.observe(sum(rec.itls_s) / len(rec.itls_s))
                if rec.ttft_s is not None:
                    self.e2e.observe(rec.ttft_s + sum(rec.itls_s))
        elif isinstance(rec, ConfigChange):
            self._on_config()

    def _on_config(self) -> None:
        config = self.engine.config_record()
        self.decode_bs_divisor.set(config.decode_bs_divisor)
        self.policy.info({"policy": config.policy})

    def render(self) -> bytes:
        return generate_latest(self.registry)
