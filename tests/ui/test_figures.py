"""The figures the panels show: percentiles as the benchmarks define them, byte rates in
decimal units, chart buckets."""
from __future__ import annotations

import numpy as np
import pytest

from pdtop.analysis.metrics import percentile
from pdtop.format import rate_bytes
from pdtop.ui.stats import bucket_max, summary


def test_summary_uses_the_benchmarks_percentile():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        values = [float(x) for x in rng.lognormal(-4.0, 1.0, n)]
        p50, p99, top = summary(iter(values))  # any iterable
        assert p50 == pytest.approx(percentile(values, 50))
        assert p99 == pytest.approx(percentile(values, 99))
        assert top == max(values)
    assert summary([]) == (None, None, None)
    assert summary([0.2, 0.1]) == pytest.approx((0.15, 0.199, 0.2))  # linear between the two


def test_rate_bytes_in_decimal_units():
    assert rate_bytes(3.35e12) == "3.35 TB/s"
    assert rate_bytes(863e9) == "863.0 GB/s"
    assert rate_bytes(12.34e6) == "12.3 MB/s"
    assert rate_bytes(999) == "999 bytes/s"
    assert rate_bytes(None) == "–"


def test_bucket_max_takes_each_slices_largest():
    points = [(0.0, 1.0), (0.4, 3.0), (0.5, 2.0), (2.5, 9.0), (3.0, 4.0), (-1.0, 99.0), (3.5, 99.0)]
    assert bucket_max(points, 0.0, 3.0, 3) == [3.0, None, 9.0]  # 3.0 is the end: the last slice
    assert bucket_max(points, 0.0, 3.0, 0) == [] and bucket_max(points, 1.0, 1.0, 2) == [None, None]
