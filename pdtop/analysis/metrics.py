"""Serving metrics as vLLM's and SGLang's benchmarks define them: percentiles of TTFT and ITL.

The benchmarks' percentile: numpy's, with linear interpolation (what vLLM's
`benchmark_serving.py` reports). The policy bench, the tuner, the round trace and the load
generator use it; the dashboard's `ui/stats.py` computes the same percentiles on its own
windows, without importing analysis.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated; NaN for no values."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(values, q))


def summary_ms(values: Sequence[float], qs: tuple[int, ...] = (50, 99)) -> dict[str, float]:
    """Seconds in, milliseconds out: {"p50": ..., "p99": ..., "max": ...}; NaN for no values."""
    out = {f"p{q}": percentile(values, q) * 1e3 for q in qs}
    out["max"] = max(values) * 1e3 if len(values) else math.nan
    return out


def gaps_since(times: Sequence[float], start: float) -> list[float]:
    """ITLs of one request from its token times: the gaps whose both tokens came at or after `start`.
    A gap that spans `start` (its earlier token before it) measures what ran before, not the window."""
    return [b - a for a, b in itertools.pairwise(times) if a >= start]
