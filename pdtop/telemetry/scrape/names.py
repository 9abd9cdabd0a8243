"""Which metrics of each engine fill which figure of a `metrics` event.

Names are the engines' own: vLLM's `vllm/v1/metrics/loggers.py` and SGLang's
`python/sglang/srt/observability/metrics_collector.py` (older: `srt/metrics/collector.py`; their metrics
documentation lists the same); pdtop's `/metrics` uses vLLM's names under `pdtop:` and adds the split
(docs/metrics.md). Where an engine renamed a metric, the newer name comes first and the older one is
read when the newer is absent. Older vLLM's `time_per_output_token_seconds` was its ITL under another
name; older SGLang's (before `inter_token_latency_seconds`) is a TPOT, each request's mean gap since its
first token observed at every streamed chunk: it fills the ITL panel and says so (`Metrics.itl_metric`).
"""
from __future__ import annotations

from dataclasses import dataclass

# How a figure is read from the series of the chosen model (summed or averaged over their other
# labels, such as vLLM's `engine` index under data parallelism):
SUM, MEAN, RATE, HISTOGRAM = "sum", "mean", "rate", "histogram"


@dataclass(frozen=True)
class Figure:
    field: str  # the `Metrics` field it fills
    how: str  # SUM / MEAN (gauges), RATE (a counter's increase per second), HISTOGRAM (percentiles)
    names: tuple[str, ...]  # metric names, the first on the page wins

    def sample_names(self, name: str) -> tuple[str, ...]:
        """The sample names that carry metric `name` in the text format (a histogram's `_count` stands for
        its `+Inf` bucket where an exporter left that out)."""
        return (name + "_bucket", name + "_count") if self.how == HISTOGRAM else (name,)


def _vllm_style(prefix: str) -> tuple[Figure, ...]:
    return (
        Figure("running", SUM, (f"{prefix}:num_requests_running",)),
        Figure("waiting", SUM, (f"{prefix}:num_requests_waiting",)),
        Figure("kv_usage", MEAN, (f"{prefix}:kv_cache_usage_perc", f"{prefix}:gpu_cache_usage_perc")),
        Figure("prompt_tokens_per_s", RATE, (f"{prefix}:prompt_tokens_total",)),
        Figure("generation_tokens_per_s", RATE, (f"{prefix}:generation_tokens_total",)),
        Figure("ttft", HISTOGRAM, (f"{prefix}:time_to_first_token_seconds",)),
        Figure("itl", HISTOGRAM, (f"{prefix}:inter_token_latency_seconds", f"{prefix}:time_per_output_token_seconds")),
        Figure("e2e", HISTOGRAM, (f"{prefix}:e2e_request_latency_seconds",)),
    )


ENGINES: dict[str, tuple[Figure, ...]] = {
    "vllm": _vllm_style("vllm"),
    "sglang": (
        Figure("running", SUM, ("sglang:num_running_reqs",)),
        Figure("waiting", SUM, ("sglang:num_queue_reqs",)),
        Figure("kv_usage", MEAN, ("sglang:token_usage",)),
        Figure("prompt_tokens_per_s", RATE, ("sglang:prompt_tokens_total",)),
        Figure("generation_tokens_per_s", RATE, ("sglang:generation_tokens_total",)),
        Figure("ttft", HISTOGRAM, ("sglang:time_to_first_token_seconds",)),
        Figure("itl", HISTOGRAM, ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")),
        Figure("e2e", HISTOGRAM, ("sglang:e2e_request_latency_seconds",)),
    ),
    "pdtop": (
        *_vllm_style("pdtop"),
        Figure("split_level", MEAN, ("pdtop:split_level",)),
        Figure("prefill_units", SUM, ("pdtop:prefill_units",)),
        Figure("decode_units", SUM, ("pdtop:decode_units",)),
    ),
}

TPOT_NAMES = frozenset({"sglang:time_per_output_token_seconds"})  # read for the ITL, but a TPOT
FIELDS: tuple[str, ...] = tuple(dict.fromkeys(f.field for figures in ENGINES.values() for f in figures))
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "pdtop": "pdtop"}  # as people write them
