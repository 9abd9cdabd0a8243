"""The statistics the dashboard panels show, on numpy.

Percentiles are numpy's default (linear interpolation), the definition
`pdtop.analysis.metrics.percentile` uses for the benchmarks, so the dashboard and
`pdtop bench` agree on what "p99" means.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def summary(values: Iterable[float]) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, max) of values; Nones when there are none."""
    array = np.fromiter(values, dtype=float)
    if array.size == 0:
        return None, None, None
    p50, p99, top = np.percentile(array, (50, 99, 100))
    return float(p50), float(p99), float(top)


def bucket_max(points: Sequence[tuple[float, float]], start: float, end: float, buckets: int) -> list[float | None]:
    """Split [start, end) into `buckets` equal slices of time; each slice's largest value (None if empty).

    `points` are (time, value) pairs in time order. Points outside the range are ignored,
    but one exactly at `end` counts in the last slice.
    """
    if buckets <= 0:
        return []
    out: list[float | None] = [None] * buckets
    span = end - start
    if span <= 0:
        return out
    scale = buckets / span
    for t, v in points:
        if t < start or t >= end:
            if t == end:
                i = buckets - 1
            else:
                continue
        else:
            i = int((t - start) * scale)
            if i >= buckets:
                i = buckets - 1
        cur = out[i]
        if cur is None or v > cur:
            out[i] = v
    return out
