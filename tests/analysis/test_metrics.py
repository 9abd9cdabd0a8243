"""The one percentile: linear interpolation between closest ranks, as vLLM's benchmark reports."""
from __future__ import annotations

import math

import pytest

from pdtop.analysis.metrics import gaps_since, percentile, summary_ms


def test_percentile_interpolates_between_ranks():
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5  # halfway between the 2nd and 3rd values
    assert math.isclose(percentile(values, 99), 3.97)  # rank 2.97 (0-based): 3 + 0.97 * (4 - 3)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_summary_in_milliseconds():
    s = summary_ms([0.010, 0.020, 0.030])
    assert s.keys() == {"p50", "p99", "max"}
    assert all(math.isclose(s[k], v) for k, v in {"p50": 20.0, "p99": 29.8, "max": 30.0}.items())
    assert all(math.isnan(v) for v in summary_ms([]).values())


def test_gaps_since_drops_the_gap_that_spans_the_start():
    """A request's first gap after `start` reaches back to its token before it: that gap measured
    what ran then (issue 30: a 5 s gap made the decode-only p99 a second), so it is not counted."""
    times = [0.0, 0.01, 5.0, 5.01, 5.03]
    assert gaps_since(times, start=4.0) == pytest.approx([0.01, 0.02])
    assert gaps_since(times, start=0.0) == pytest.approx([0.01, 4.99, 0.01, 0.02])  # at start counts
    assert gaps_since(times, start=6.0) == [] and gaps_since([], 0.0) == []
