"""Prefill/decode disaggregation figures of a `/metrics` page: the `disagg` object of a `metrics` event.

SGLang (0.5.23: `python/sglang/srt/observability/metrics_collector.py`, PD disaggregation): the prefill
server's bootstrap queue (older SGLang: `num_prefill_prealloc_queue_reqs`) and in-flight queue, the
decode server's prealloc, transfer and host-receive queues (gauges); KV transfer latency (ms), speed
(GB/s) and size (MB), gauges in older SGLang and histograms of the same names in newer SGLang (read as
p50 over the window), and newer SGLang's bootstrap and allocation times (ms histograms, p50);
bootstrap and transfer failures and prefill retries (counters, as their increase over the window).
vLLM's NIXL and Mooncake connectors (vLLM 0.33: `vllm/distributed/kv_transfer/kv_connector/v1/nixl/`,
`.../mooncake/stats.py`): `vllm:{nixl,mooncake}_xfer_time_seconds` and `..._bytes_transferred`
histograms (speed = bytes over transfer time in the window) and `..._num_failed_transfers`. A page
with none of them has no `disagg`; a figure the page lacks is left out of it (`Disagg.absent`), one it
has but cannot tell yet (nothing observed) is null.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from prometheus_client.samples import Sample

from pdtop.telemetry.events import Disagg, Quantiles
from pdtop.telemetry.scrape.window import Key, Window

QUEUES = {  # field -> SGLang gauges, the newer name first
    "prefill_bootstrap_queue": ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_prealloc_queue_reqs"),
    "prefill_inflight_queue": ("sglang:num_prefill_inflight_queue_reqs",),
    "decode_prealloc_queue": ("sglang:num_decode_prealloc_queue_reqs",),
    "decode_transfer_queue": ("sglang:num_decode_transfer_queue_reqs",),
    "decode_host_receive_queue": ("sglang:num_decode_host_receive_queue_reqs",),
}
TRANSFER = {  # field -> SGLang gauge (older) or histogram (newer) of the same name
    "kv_transfer_latency_ms": "sglang:kv_transfer_latency_ms",
    "kv_transfer_speed_gb_s": "sglang:kv_transfer_speed_gb_s",
    "kv_transfer_mb": "sglang:kv_transfer_total_mb",
    "kv_bootstrap_ms": "sglang:kv_transfer_bootstrap_ms",
    "kv_alloc_ms": "sglang:kv_transfer_alloc_ms",
}
FAILURES = {  # field -> counter sample
    "bootstrap_failures": "sglang:num_bootstrap_failed_reqs_total",
    "transfer_failures": "sglang:num_transfer_failed_reqs_total",
    "prefill_retries": "sglang:num_prefill_retries_total",
}
CONNECTORS = ("nixl", "mooncake")  # vLLM's KV connectors with the same three metrics


def _connector(name: str) -> tuple[str, str, str]:
    """A vLLM connector's transfer-time and bytes histograms and its failed-transfers counter sample."""
    return f"vllm:{name}_xfer_time_seconds", f"vllm:{name}_bytes_transferred", f"vllm:{name}_num_failed_transfers_total"


HISTOGRAMS = (*TRANSFER.values(), *(h for c in CONNECTORS for h in _connector(c)[:2]))
FIELDS = (*QUEUES, *TRANSFER, *FAILURES)
_NAMES = tuple(f.name for f in dataclasses.fields(Disagg) if f.name != "absent")


def sample_names() -> tuple[str, ...]:
    """Every sample name read here: the page keeps their lines."""
    names = [*(n for names in QUEUES.values() for n in names), *TRANSFER.values(), *FAILURES.values(),
             *(_connector(c)[2] for c in CONNECTORS)]
    for h in HISTOGRAMS:
        names += [h + "_bucket", h + "_sum", h + "_count"]
    return tuple(names)


def histogram_series(buckets: list[Sample], counts: list[Sample]) -> list[Sample]:
    """The series of a histogram the window follows: its buckets, and its `_count` only where it has no
    `+Inf` bucket (the count then stands for it)."""
    if any(s.labels.get("le") == "+Inf" for s in buckets):
        return buckets
    return [*buckets, *counts]


def counters(by_name: dict[str, list[Sample]], key: Callable[[Sample], Key]) -> dict[Key, float]:
    """The counter-like series (failures, histogram buckets and sums) the window must follow."""
    names = [*FAILURES.values(), *(_connector(c)[2] for c in CONNECTORS)] + [h + "_sum" for h in HISTOGRAMS]
    out = {key(s): s.value for name in names for s in by_name.get(name, ())}
    for h in HISTOGRAMS:
        series = histogram_series(by_name.get(h + "_bucket", []), by_name.get(h + "_count", []))
        out |= {key(s): s.value for s in series}
    return out


def disagg(by_name: dict[str, list[Sample]], window: Window, key: Callable[[Sample], Key],
           quantiles: Callable[[Window, list[Sample], list[Sample]], Quantiles],
           finite: Callable[[float], float | str]) -> Disagg | None:
    """The `disagg` object, or None when the page has no disaggregation metrics."""
    out: dict[str, Any] = {}

    def total(name: str) -> float:
        return sum(window.increase(key(s)) for s in by_name.get(name, ()))

    def p50(name: str) -> float | str | None:
        return quantiles(window, by_name.get(name + "_bucket", []), by_name.get(name + "_count", [])).p50_s

    for field, names in QUEUES.items():
        name = next((n for n in names if by_name.get(n)), None)
        if name is not None:
            out[field] = finite(sum(s.value for s in by_name[name]))
    kinds = set()
    for field, name in TRANSFER.items():
        if by_name.get(name + "_bucket"):  # newer SGLang: p50 over the window
            out[field] = p50(name)
            kinds.add("histogram")
        elif by_name.get(name):  # older SGLang: the latest value
            samples = by_name[name]
            out[field] = finite(sum(s.value for s in samples) / len(samples))
            kinds.add("gauge")
    for field, name in FAILURES.items():
        if by_name.get(name):
            out[field] = finite(total(name))
    for connector in CONNECTORS:
        xfer_time, xfer_bytes, failed = _connector(connector)
        if by_name.get(xfer_time + "_bucket"):
            kinds.add(connector)
            latency = p50(xfer_time)
            out["kv_transfer_latency_ms"] = latency * 1e3 if isinstance(latency, float | int) else latency
            seconds, moved = total(xfer_time + "_sum"), total(xfer_bytes + "_sum")
            out["kv_transfer_speed_gb_s"] = finite(moved / seconds / 1e9) if seconds > 0 else None
            if by_name.get(xfer_bytes + "_bucket"):
                size = p50(xfer_bytes)
                out["kv_transfer_mb"] = size / 1e6 if isinstance(size, float | int) else size
        if by_name.get(failed):
            out["transfer_failures"] = finite(total(failed))
    if not out:
        return None
    out["transfer_metrics"] = ", ".join(sorted(kinds)) or None
    return Disagg(**out, absent=frozenset(name for name in _NAMES if name not in out))
