"""`histogram_quantile` against values worked out by hand with Prometheus's rules."""
from __future__ import annotations

import math

import pytest

from pdtop.telemetry.scrape.quantile import histogram_quantile

INF = math.inf
# 10 observations: 4 in (0.01, 0.025], 4 in (0.025, 0.05], 2 in (0.05, 0.075]
BUCKETS = [(0.01, 0), (0.025, 4), (0.05, 8), (0.075, 10), (0.1, 10), (INF, 10)]


def test_interpolates_inside_the_bucket_where_the_rank_falls():
    # p50: rank 5, in (0.025, 0.05] which holds 4 of them, the 1st: 0.025 + 0.025 * 1/4
    assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.03125)
    # p90: rank 9, in (0.05, 0.075] holding 2, the 1st: 0.05 + 0.025 * 1/2
    assert histogram_quantile(0.9, BUCKETS) == pytest.approx(0.0625)
    # p99: rank 9.9: 0.05 + 0.025 * 1.9/2
    assert histogram_quantile(0.99, BUCKETS) == pytest.approx(0.07375)
    # the first bucket starts at 0: 3 of 4 observations all in (0, 1] -> rank 1.5 of 3 -> 0.5
    assert histogram_quantile(0.5, [(1.0, 3), (2.0, 3), (INF, 3)]) == pytest.approx(0.5)


def test_order_of_buckets_and_repeated_bounds_do_not_matter():
    shuffled = [BUCKETS[i] for i in (5, 2, 0, 4, 1, 3)]
    assert histogram_quantile(0.5, shuffled) == histogram_quantile(0.5, BUCKETS)
    split = [(0.025, 1), (0.025, 3), (0.05, 8), (INF, 8)]  # the same bound twice: summed to 4
    assert histogram_quantile(0.5, split) == pytest.approx(0.025)  # rank 4, the last of (0, 0.025]: 0.025 * 4/4


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound():
    assert histogram_quantile(0.99, [(0.1, 5), (0.2, 6), (INF, 10)]) == 0.2


def test_counts_that_go_down_are_made_monotonic():
    # (0.05, 7) is below its predecessor: read as 8, so (0.05, ...] holds 0 and (0.075, ...] holds 2
    broken = [(0.01, 0), (0.025, 4), (0.05, 8), (0.06, 7), (0.075, 10), (INF, 10)]
    assert histogram_quantile(0.9, broken) == pytest.approx(0.06 + 0.015 * 1 / 2)


def test_nan_where_prometheus_gives_nan_and_the_q_limits():
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0), (INF, 0)]))  # nothing observed
    assert math.isnan(histogram_quantile(0.5, [(0.1, 3), (0.2, 4)]))  # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, [(INF, 4)]))  # one bucket
    assert math.isnan(histogram_quantile(math.nan, BUCKETS))
    assert histogram_quantile(-0.1, BUCKETS) == -INF and histogram_quantile(1.1, BUCKETS) == INF
    assert histogram_quantile(0.5, [(-1.0, 4), (0.0, 4), (INF, 4)]) == -1.0  # first bucket at or below 0
