"""Which way each decode step ran, per decode stream: replayed from a CUDA graph, or eagerly and why.

`CudaDecoder` asks `route` for every step and records the answer in a `GraphCounts`, keyed by the
stream's handle; a measurement snapshots the counts before and after and asks `replayed` whether
every step in between replayed a graph (so a figure labelled "graph" is known to be one). Pure
Python, so the choice and the counting are tested without a GPU.
"""
from __future__ import annotations

import copy
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

GRAPHS_OFF = "graphs off"  # --no-cuda-graph, an attention path without graphs, or switched off to compare
NO_BUCKET = "no bucket"  # more rows than the largest bucket
CAPTURE_FAILED = "capture failed"  # this stream's capture raised: it decodes eagerly
NO_GRAPH = "no graph for this stream"  # e.g. the default stream, or a stream not (yet) synced
OVER_ENTRIES = "more KV blocks than the graph holds"  # torch-paged: its static block list is too short


def bucket_for(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `rows` decode rows; None above the largest (run eagerly)."""
    return next((b for b in sorted(buckets) if b >= rows), None)


def route(rows: int, buckets: Sequence[int], *, graphs_on: bool, captured: Container[int] | None,
          failed: bool) -> tuple[int | None, str]:
    """The bucket a step of `rows` rows replays on a stream, or `(None, why it runs eagerly)`.
    `captured`: the stream's buckets with a graph (None: none); `failed`: its capture failed."""
    if not graphs_on:
        return None, GRAPHS_OFF
    bucket = bucket_for(rows, buckets)
    if bucket is None:
        return None, NO_BUCKET
    if failed:
        return None, CAPTURE_FAILED
    if captured is None or bucket not in captured:
        return None, NO_GRAPH
    return bucket, ""


@dataclass
class StreamCounts:
    replays: int = 0
    eager: dict[str, int] = field(default_factory=dict)  # reason -> steps

    @property
    def eager_steps(self) -> int:
        return sum(self.eager.values())

    def as_dict(self) -> dict[str, object]:
        return {"replays": self.replays, "eager_steps": self.eager_steps, "eager": dict(self.eager)}


class GraphCounts:
    """Per decode stream handle: graph replays and eager steps by reason."""

    def __init__(self) -> None:
        self.streams: dict[int, StreamCounts] = {}

    def record(self, stream: int, bucket: int | None, reason: str) -> None:
        c = self.streams.setdefault(stream, StreamCounts())
        if bucket is not None:
            c.replays += 1
        else:
            c.eager[reason] = c.eager.get(reason, 0) + 1

    def snapshot(self) -> dict[int, StreamCounts]:
        return copy.deepcopy(self.streams)

    def totals(self) -> StreamCounts:
        out = StreamCounts()
        for c in self.streams.values():
            out.replays += c.replays
            for why, n in c.eager.items():
                out.eager[why] = out.eager.get(why, 0) + n
        return out


def delta(before: dict[int, StreamCounts], after: dict[int, StreamCounts]) -> StreamCounts:
    """The steps between two snapshots, every stream together."""
    out = StreamCounts()
    for key, c in after.items():
        was = before.get(key, StreamCounts())
        out.replays += c.replays - was.replays
        for why, n in c.eager.items():
            if n - was.eager.get(why, 0):
                out.eager[why] = out.eager.get(why, 0) + n - was.eager.get(why, 0)
    return out


def replayed(before: dict[int, StreamCounts], after: dict[int, StreamCounts]) -> bool:
    """Every decode step between the snapshots replayed a graph (and there was at least one)."""
    d = delta(before, after)
    return d.replays > 0 and d.eager_steps == 0
