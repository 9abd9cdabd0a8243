"""Figures over a window of rounds, as the panels show them: decode step time, bandwidth,
output throughput and the per-level table. Pure functions of `RoundPoint`s (the dashboard
state keeps the rounds and picks the window; see `DashboardState.window` and `slices`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.ui.stats import bucket_max, summary


@dataclass(slots=True)
class RoundPoint:
    """The figures of a round the charts, the level table and the timeline need."""

    index: int
    time: float
    span_s: float  # engine time since the previous round ended (this round and any idle wait before it)
    decode_step_s: float
    round_s: float
    bytes_moved: float
    tokens: int
    decode_bs: int
    level: int
    prefill_units: int
    decode_units: int
    idle: bool  # no request anywhere: nothing ran, nothing waits
    itl_s: float | None  # the decode batch's token gap that ended in this round (None: no decode, or unknown)
    prefill_ids: tuple[int, ...]  # requests of the first prefill in flight in the round (empty: none)
    prefill_frac: float  # its layers done by the end of the layers in flight (done + k) / total
    transfer_bytes: int = 0  # disagg: KV bytes on the link at the end of the round


@dataclass
class LevelStat:
    """One row of the per-level table: where the engine spent the window, and the ITL there."""

    level: int | None  # None: idle (no request anywhere)
    prefill_units: int
    decode_units: int
    share: float  # of the window's engine time
    itl_p50_s: float | None
    itl_p99_s: float | None


def step_summary(rounds: list[RoundPoint]) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, max) of the decode step time over `rounds` (those that decoded)."""
    return summary(r.decode_step_s for r in rounds if r.decode_bs > 0)


def step_series(rounds: list[RoundPoint], span: tuple[float, float], buckets: int) -> list[float | None]:
    """Worst decode step per time slice of `span` (start, end), oldest first."""
    return bucket_max([(r.time, r.decode_step_s) for r in rounds if r.decode_bs > 0], *span, buckets)


def bandwidth(rounds: list[RoundPoint]) -> tuple[float | None, float | None]:
    """(average over `rounds`, last round) of estimated bytes/s: bytes_moved / round time."""
    busy = sum(r.round_s for r in rounds)
    avg = sum(r.bytes_moved for r in rounds) / busy if busy > 0 else None
    last = rounds[-1] if rounds else None
    last_bps = last.bytes_moved / last.round_s if last and last.round_s > 0 else None
    return avg, last_bps


def bandwidth_series(rounds: list[RoundPoint], span: tuple[float, float], buckets: int) -> list[float | None]:
    """Highest bytes/s per time slice of `span` (start, end), oldest first."""
    return bucket_max([(r.time, r.bytes_moved / r.round_s) for r in rounds if r.round_s > 0], *span, buckets)


def output_throughput(rounds: list[RoundPoint]) -> float | None:
    """vLLM's output throughput: output tokens / elapsed engine time over `rounds` (idle time counts)."""
    elapsed = sum(r.span_s for r in rounds)
    return sum(r.tokens for r in rounds) / elapsed if elapsed > 0 else None


def level_stats(rounds: list[RoundPoint]) -> list[LevelStat]:
    """Per split seen in `rounds` (and idle): its share of engine time and the decode batch's ITL
    p50/p99 in its rounds. Keyed by the split (prefill units, decode units), not the level's index:
    after the levels change, an index names another split. Splits by decode units, idle last."""
    spans: dict[tuple[int, int] | None, float] = {}
    gaps: dict[tuple[int, int] | None, list[float]] = {}
    latest: dict[tuple[int, int] | None, RoundPoint] = {}
    for r in rounds:
        key = None if r.idle else (r.prefill_units, r.decode_units)
        spans[key] = spans.get(key, 0.0) + r.span_s
        latest[key] = r
        if r.itl_s is not None:
            gaps.setdefault(key, []).append(r.itl_s)
    total = sum(spans.values())
    out = []
    for key in sorted(spans, key=lambda k: (k is None, k[1] if k else 0)):
        p50, p99, _ = summary(gaps.get(key, ()))
        r = latest[key]
        out.append(LevelStat(None if key is None else r.level, r.prefill_units, r.decode_units,
                             spans[key] / total if total > 0 else 0.0, p50, p99))
    return out


def level_rows(levels: list[tuple[int, int]], rounds: list[RoundPoint], since: float
               ) -> list[tuple[int | None, int, int, LevelStat | None]]:
    """The level table: (level, prefill units, decode units, its figures) per level in force, then
    idle if the window has idle time. Only rounds from `since` (when these levels came in) count,
    matched to a level by its split."""
    stats = {None if s.level is None else (s.prefill_units, s.decode_units): s
             for s in level_stats([r for r in rounds if r.time > since])}
    rows: list[tuple[int | None, int, int, LevelStat | None]] = [(i, p, d, stats.get((p, d)))
                                                                  for i, (p, d) in enumerate(levels)]
    if None in stats:
        idle = stats[None]
        rows.append((None, idle.prefill_units, idle.decode_units, idle))
    return rows
