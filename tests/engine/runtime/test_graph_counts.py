"""Which way a decode step runs on a stream (`route`) and what the counts say afterwards: a figure is
"graph_replayed" only when every step it timed replayed a graph."""
from __future__ import annotations

import pytest

from pdtop.engine.runtime.cuda_graphs import DEFAULT_BUCKETS
from pdtop.engine.runtime.graph_counts import (
    CAPTURE_FAILED,
    GRAPHS_OFF,
    NO_BUCKET,
    NO_GRAPH,
    OVER_ENTRIES,
    GraphCounts,
    delta,
    replayed,
    route,
)

CAPTURED = {b: object() for b in DEFAULT_BUCKETS}  # a stream with a graph for every bucket


@pytest.mark.parametrize("rows,kw,want", [
    (3, {"graphs_on": True, "captured": CAPTURED, "failed": False}, (4, "")),
    (64, {"graphs_on": True, "captured": CAPTURED, "failed": False}, (64, "")),
    (3, {"graphs_on": False, "captured": CAPTURED, "failed": False}, (None, GRAPHS_OFF)),
    (65, {"graphs_on": True, "captured": CAPTURED, "failed": False}, (None, NO_BUCKET)),
    (3, {"graphs_on": True, "captured": None, "failed": True}, (None, CAPTURE_FAILED)),
    (3, {"graphs_on": True, "captured": None, "failed": False}, (None, NO_GRAPH)),
    (3, {"graphs_on": True, "captured": {8: object()}, "failed": False}, (None, NO_GRAPH)),  # its bucket 4 is missing
])
def test_route(rows, kw, want):
    assert route(rows, DEFAULT_BUCKETS, **kw) == want


def test_counts_per_stream_and_between_snapshots():
    counts = GraphCounts()
    counts.record(11, 4, "")
    counts.record(22, None, CAPTURE_FAILED)
    before = counts.snapshot()
    for _ in range(3):
        counts.record(11, 32, "")
    assert replayed(before, counts.snapshot())  # only replays since the snapshot
    assert counts.streams[11].replays == 4 and counts.streams[22].eager_steps == 1
    assert before[11].replays == 1  # a snapshot is a copy

    mid = counts.snapshot()
    counts.record(11, 32, "")
    counts.record(33, None, OVER_ENTRIES)  # a stream first seen after the snapshot
    d = delta(mid, counts.snapshot())
    assert d.replays == 1 and d.eager == {OVER_ENTRIES: 1}
    assert not replayed(mid, counts.snapshot())  # one eager step spoils the figure
    assert not replayed(counts.snapshot(), counts.snapshot())  # no step at all is not a replay

    totals = counts.totals().as_dict()
    assert totals == {"replays": 5, "eager_steps": 2, "eager": {CAPTURE_FAILED: 1, OVER_ENTRIES: 1}}


def test_eager_only_is_not_replayed():
    counts = GraphCounts()
    before = counts.snapshot()
    counts.record(11, None, GRAPHS_OFF)
    assert not replayed(before, counts.snapshot())
