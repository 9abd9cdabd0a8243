"""Prefill/decode disaggregation figures of a `/metrics` page: the `disagg` object of a `metrics` event.

SGLang (`python/sglang/srt/observability/metrics_collector.py`, PD disaggregation): the prefill
server's bootstrap and in-flight queues, the decode server's prealloc and transfer queues (gauges);
KV transfer latency (ms), speed (GB/s) and size (MB), gauges in older SGLang and histograms of the same
names in newer SGLang (read as p50 over the window); bootstrap and transfer failures and prefill
retries (counters, as their increase over the window). vLLM's NIXL connector
(`vllm/distributed/kv_transfer/kv_connector/v1/nixl`): `vllm:nixl_xfer_time_seconds` and
`vllm:nixl_bytes_transferred` histograms (speed = bytes over transfer time in the window) and
`vllm:nixl_num_failed_transfers`. A page with none of them has no `disagg`; a figure the page lacks is
left out of it (`Disagg.absent`), one it has but cannot tell yet (nothing observed) is null.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from prometheus_client.samples import Sample

from pdtop.telemetry.events import Disagg, Quantiles
from pdtop.telemetry.scrape.window import Key, Window

QUEUES = {  # field -> SGLang gauge
    "prefill_bootstrap_queue": "sglang:num_prefill_bootstrap_queue_reqs",
    "prefill_inflight_queue": "sglang:num_prefill_inflight_queue_reqs",
    "decode_prealloc_queue": "sglang:num_decode_prealloc_queue_reqs",
    "decode_transfer_queue": "sglang:num_decode_transfer_queue_reqs",
}
TRANSFER = {  # field -> SGLang gauge (older) or histogram (newer) of the same name
    "kv_transfer_latency_ms": "sglang:kv_transfer_latency_ms",
    "kv_transfer_speed_gb_s": "sglang:kv_transfer_speed_gb_s",
    "kv_transfer_mb": "sglang:kv_transfer_total_mb",
}
FAILURES = {  # field -> counter sample
    "bootstrap_failures": "sglang:num_bootstrap_failed_reqs_total",
    "transfer_failures": "sglang:num_transfer_failed_reqs_total",
    "prefill_retries": "sglang:num_prefill_retries_total",
}
NIXL_TIME, NIXL_BYTES = "vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
HISTOGRAMS = (*TRANSFER.values(), NIXL_TIME, NIXL_BYTES)
FIELDS = (*QUEUES, *TRANSFER, *FAILURES)
_NAMES = tuple(f.name for f in dataclasses.fields(Disagg) if f.name != "absent")


def sample_names() -> tuple[str, ...]:
    """Every sample name read here: the page keeps their lines."""
    names = [*QUEUES.values(), *TRANSFER.values(), *FAILURES.values(), NIXL_FAILED]
    for h in HISTOGRAMS:
        names += [h + "_bucket", h + "_sum", h + "_count"]
    return tuple(names)


def counters(by_name: dict[str, list[Sample]], key: Callable[[Sample], Key]) -> dict[Key, float]:
    """The counter-like series (failures, histogram buckets and sums) the window must follow."""
    names = [*FAILURES.values(), NIXL_FAILED] + [h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum")]
    return {key(s): s.value for name in names for s in by_name.get(name, ())}


def disagg(by_name: dict[str, list[Sample]], window: Window, key: Callable[[Sample], Key],
           quantiles: Callable[[Window, list[Sample]], Quantiles],
           finite: Callable[[float], float | str]) -> Disagg | None:
    """The `disagg` object, or None when the page has no disaggregation metrics."""
    out: dict[str, Any] = {}

    def total(name: str) -> float:
        return sum(window.increase(key(s)) for s in by_name.get(name, ()))

    for field, name in QUEUES.items():
        if by_name.get(name):
            out[field] = finite(sum(s.value for s in by_name[name]))
    kinds = set()
    for field, name in TRANSFER.items():
        if by_name.get(name + "_bucket"):  # newer SGLang: p50 over the window
            out[field] = quantiles(window, by_name[name + "_bucket"]).p50_s
            kinds.add("histogram")
        elif by_name.get(name):  # older SGLang: the latest value
            samples = by_name[name]
            out[field] = finite(sum(s.value for s in samples) / len(samples))
            kinds.add("gauge")
    for field, name in FAILURES.items():
        if by_name.get(name):
            out[field] = finite(total(name))
    if by_name.get(NIXL_TIME + "_bucket"):
        kinds.add("nixl")
        p50 = quantiles(window, by_name[NIXL_TIME + "_bucket"]).p50_s
        out["kv_transfer_latency_ms"] = p50 * 1e3 if isinstance(p50, float | int) else p50
        seconds, moved = total(NIXL_TIME + "_sum"), total(NIXL_BYTES + "_sum")
        out["kv_transfer_speed_gb_s"] = finite(moved / seconds / 1e9) if seconds > 0 else None
        if by_name.get(NIXL_BYTES + "_bucket"):
            size = quantiles(window, by_name[NIXL_BYTES + "_bucket"]).p50_s
            out["kv_transfer_mb"] = size / 1e6 if isinstance(size, float | int) else size
    if by_name.get(NIXL_FAILED):
        out["transfer_failures"] = finite(total(NIXL_FAILED))
    if not out:
        return None
    out["transfer_metrics"] = ", ".join(sorted(kinds)) or None
    return Disagg(**out, absent=frozenset(name for name in _NAMES if name not in out))
