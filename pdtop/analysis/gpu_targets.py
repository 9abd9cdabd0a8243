"""The verdict of `bench/gpu_check.py`: issue 30's targets, read from its report (a plain dict).

Every target is always in the verdict: True (met), False (not met) or None (not measured: the
section that measures it is missing, failed, or predates the key). A target over several parts
(levels, sides) is the three-valued AND of its parts: False if any part is not met, else None if
any part was not measured, else True. Each target also gets a one-line note saying what was read.
Pure: no torch, no CUDA, so it is tested on hand-built reports.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

SM_TOLERANCE = 4  # measured SMs within this many of the realized count (two TPCs)
HOST_OVER_GPU_MAX = 0.10
DECODE_ONLY_RATIO = 1.3
CHUNKED_FRACTION = 0.25

TARGETS = ("realized_equals_requested", "measured_sms_match_realized", "graphs_replayed_on_every_level",
           "graph_host_under_10pct_of_gpu", "pdmux_itl_p99_within_1.3x_decode_only",
           "pdmux_itl_p99_at_most_quarter_of_chunked_2048")

Verdict = bool | None


def all3(parts: Iterable[Verdict]) -> Verdict:
    """Three-valued AND; None for no parts (nothing was measured)."""
    parts = list(parts)
    if not parts:
        return None
    if any(p is False for p in parts):
        return False
    return None if any(p is None for p in parts) else True


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _levels(report: dict[str, Any]) -> list[dict[str, Any]]:
    levels = report.get("levels")
    return [x for x in levels if isinstance(x, dict)] if isinstance(levels, list) else []


def _pair(x: Any) -> tuple[float, float] | None:
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        return None
    p, d = _num(x[0]), _num(x[1])
    return None if p is None or d is None else (p, d)


def measured_count(side: Any) -> float | None:
    """One side's measured SMs: a number, or {"smid_distinct": n, "timed_sms": x} (the %smid count
    first: it says which SMs ran; the timing is an estimate). None: not measured."""
    if isinstance(side, dict):
        return next((v for v in map(_num, (side.get("smid_distinct"), side.get("timed_sms"))) if v is not None), None)
    return _num(side)


def realized(report: dict[str, Any]) -> tuple[Verdict, str]:
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    pairs = [(x.get("level"), _pair(x.get("requested")), _pair(x.get("realized"))) for x in levels]
    verdict = all3(None if a is None or b is None else a == b for _, a, b in pairs)
    off = [level for level, a, b in pairs if a is not None and b is not None and a != b]
    note = (f"levels {off} differ from what was requested" if off else f"{len(levels)} levels as requested"
            if verdict else "levels without requested or realized SMs")
    return verdict, note


def measured_sms(report: dict[str, Any]) -> tuple[Verdict, str]:
    """Each split level's `measured_sms` sides (prefill, decode) against its realized SMs. The end
    levels (one side 0) run on ordinary whole-device streams, with no green context to check."""
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    parts: list[Verdict] = []
    notes: list[str] = []
    for x in levels:
        real = _pair(x.get("realized"))
        if real is None:
            parts.append(None)
            continue
        if 0 in real:
            continue
        m = _dict(x.get("measured_sms"))
        for side, want in zip(("prefill", "decode"), real, strict=True):
            got = measured_count(m.get(side))
            parts.append(None if got is None else abs(got - want) <= SM_TOLERANCE)
            if got is not None and abs(got - want) > SM_TOLERANCE:
                notes.append(f"level {x.get('level')} {side} {got:g} of {want:g}")
    verdict = all3(parts)
    if verdict is None and not notes:
        missing = sum(p is None for p in parts)
        return None, f"{missing} of {len(parts)} split level sides without measured_sms" if parts else "no split levels"
    return verdict, "; ".join(notes) or f"{len(parts)} split level sides within {SM_TOLERANCE} SMs"


def _flag(row: Any) -> Verdict:
    """A row's `graph_replayed`: its own, else that of the figures it holds (an overlap row's decode
    part, say), else None."""
    row = _dict(row)
    if isinstance(row.get("graph_replayed"), bool):
        return bool(row["graph_replayed"])
    inner = [v["graph_replayed"] for v in row.values() if isinstance(_dict(v).get("graph_replayed"), bool)]
    return all3(inner)


def graphs_replayed(report: dict[str, Any]) -> tuple[Verdict, str]:
    """`graph_replayed` of every level decode runs on with SMs of its own: each split level's `overlap`
    row, the decode-side figures of `decode_step.graph` at its level, and the whole-GPU figure for
    the last level. A level with no flag anywhere was not measured."""
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    flags: dict[Any, list[Verdict]] = {x.get("level"): [] for x in levels if (_pair(x.get("realized")) or (0, 0))[1]}
    graph = _dict(_dict(report.get("decode_step")).get("graph"))
    last = levels[-1].get("level")
    at = _dict(graph.get("level")).get("index")
    rows = [(last if where == "alone_whole_gpu" else at, row) for where, row in graph.items()
            if isinstance(row, dict) and "wall_ms" in row]
    overlap = report.get("overlap")
    rows += [(row.get("level"), row) for row in (overlap if isinstance(overlap, list) else []) if isinstance(row, dict)]
    for level, row in rows:
        if level in flags:
            flags[level].append(_flag(row))
    per_level = {k: all3(v) for k, v in flags.items()}
    verdict = all3(per_level.values())
    eager = [k for k, v in per_level.items() if v is False]
    unmeasured = [k for k, v in per_level.items() if v is None]
    note = (f"eager on levels {eager}" if eager else f"no graph_replayed for levels {unmeasured}" if unmeasured
            else f"replayed on {len(per_level)} levels")
    return verdict, note


def host_under_gpu(report: dict[str, Any]) -> tuple[Verdict, str]:
    row = _dict(_dict(_dict(report.get("decode_step")).get("graph")).get("alone_whole_gpu"))
    ratio = _num(row.get("host_over_gpu"))
    if ratio is None:
        return None, "no graph figure on the whole GPU"
    return ratio < HOST_OVER_GPU_MAX, f"host/gpu {ratio:.3f}"


def itl_ratio(report: dict[str, Any], base: str, limit: float) -> tuple[Verdict, str]:
    """pdmux's ITL p99 under prefill against `limit` x `itl_ms[base]`."""
    itl = _dict(report.get("itl_ms"))
    pdmux, ref = _num(itl.get("pdmux_under_prefill")), _num(itl.get(base))
    if pdmux is None or ref is None or ref <= 0:
        show = {k: "none" if v is None else f"{v:.1f} ms" for k, v in (("pdmux_under_prefill", pdmux), (base, ref))}
        return None, ", ".join(f"{k} {v}" for k, v in show.items())
    return pdmux <= limit * ref, f"{pdmux:.1f} ms against {limit:g} x {ref:.1f} ms"


def targets(report: dict[str, Any]) -> tuple[dict[str, Verdict], dict[str, str]]:
    """Every target (TARGETS, in order) as True/False/None, and a note for each."""
    found = {
        "realized_equals_requested": realized(report),
        "measured_sms_match_realized": measured_sms(report),
        "graphs_replayed_on_every_level": graphs_replayed(report),
        "graph_host_under_10pct_of_gpu": host_under_gpu(report),
        "pdmux_itl_p99_within_1.3x_decode_only": itl_ratio(report, "decode_only", DECODE_ONLY_RATIO),
        "pdmux_itl_p99_at_most_quarter_of_chunked_2048": itl_ratio(report, "chunked_2048", CHUNKED_FRACTION),
    }
    return {k: found[k][0] for k in TARGETS}, {k: found[k][1] for k in TARGETS}


def verdict_word(v: Verdict) -> str:
    return "met" if v is True else "NOT met" if v is False else "not measured"
