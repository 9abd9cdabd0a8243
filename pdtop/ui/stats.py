"""Small, dependency-free statistics used by the dashboard panels."""
from __future__ import annotations

import math
from typing import Iterable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of already sorted values, nearest-rank; None when empty."""
    if not sorted_values:
        return None
    if q <= 0:
        return sorted_values[0]
    rank = math.ceil(q / 100.0 * len(sorted_values))
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def summary(values: Iterable[float]) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, max) of values; Nones when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None, None, None
    return percentile(ordered, 50), percentile(ordered, 99), ordered[-1]


def bucket_max(points: Sequence[tuple[float, float]], start: float, end: float, buckets: int) -> list[float | None]:
    """Split [start, end) into `buckets` equal slices of time; each slice's largest value (None if empty).

    `points` are (time, value) pairs in time order. Points outside the range are ignored.
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
