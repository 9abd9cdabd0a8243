"""Serving metrics as vLLM's and SGLang's benchmarks define them: percentiles of TTFT and ITL."""
from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(values: Sequence[float], qs: tuple[int, ...] = (50, 99)) -> dict[str, float]:
    """Seconds in, milliseconds out: {"p50": ..., "p99": ..., "max": ...}."""
    out = {f"p{q}": percentile(values, q) * 1e3 for q in qs}
    out["max"] = max(values) * 1e3 if values else math.nan
    return out
