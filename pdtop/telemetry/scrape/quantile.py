"""Prometheus's `histogram_quantile` over classic buckets, step for step (promql/quantile.go,
`bucketQuantile`): buckets sorted by upper bound, those with the same bound merged, counts made
monotonic (tiny float differences ignored), then linear interpolation inside the bucket where the
rank falls; the first bucket starts at 0, and a rank in the +Inf bucket gives the highest finite bound.
"""
from __future__ import annotations

import bisect
import math
import sys

_SMALL_DELTA = 1e-12  # Prometheus's smallDeltaTolerance
_MIN_NORMAL = sys.float_info.min


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """`buckets`: (upper bound `le`, cumulative count) pairs, one with bound +Inf. NaN where Prometheus
    gives NaN: no +Inf bucket, fewer than two buckets, or no observations."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: list[list[float]] = []
    for bound, count in sorted(buckets):
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    if not merged or merged[-1][0] != math.inf:
        return math.nan
    _ensure_monotonic(merged)
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    counts = [c for _, c in merged[:-1]]
    b = bisect.bisect_left(counts, rank)  # the first bucket holding at least `rank` observations
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def _ensure_monotonic(buckets: list[list[float]]) -> None:
    """A count below its predecessor is raised to it, one within float noise of it is set to it."""
    prev = buckets[0][1]
    for bucket in buckets[1:]:
        cur = bucket[1]
        if cur == prev:
            continue
        if _almost_equal(prev, cur) or cur < prev:
            bucket[1] = prev
            continue
        prev = cur


def _almost_equal(a: float, b: float) -> bool:
    abs_sum, diff = abs(a) + abs(b), abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < _SMALL_DELTA * _MIN_NORMAL
    return diff / min(abs_sum, sys.float_info.max) < _SMALL_DELTA
