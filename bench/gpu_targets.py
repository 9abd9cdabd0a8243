"""The verdict of `bench/gpu_check.py`: issue 30's targets, read from its report (a plain dict).

Every target is always in the verdict: True (met), False (not met) or None (not measured: the
section that measures it is missing, failed, or predates the key). A target over several parts
(levels, sides) is the three-valued AND of its parts: False if any part is not met, else None if
any part was not measured, else True. Each target also gets a one-line note saying what was read.
A verdict cannot pass by accident: a level the driver refused (`device.dropped_levels`) fails
`realized_equals_requested`, a GPU run with no split level fails `measured_sms_match_realized`, and
a split level whose two sides ran on shared SMs (`shared_smids`) fails it too.
Pure: no torch, no CUDA, so it is tested on hand-built reports. It sits beside the check, which
imports it from its own folder (bench/ is not a package).
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


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _levels(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [x for x in _list(report.get("levels")) if isinstance(x, dict)]


def _pair(x: Any) -> tuple[float, float] | None:
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        return None
    p, d = _num(x[0]), _num(x[1])
    return None if p is None or d is None else (p, d)


def _is_split(pair: tuple[float, float] | None) -> bool:
    return pair is not None and 0 not in pair


def _gpu(report: dict[str, Any]) -> bool:
    return report.get("mode") == "gpu"


def measured_count(side: Any) -> float | None:
    """One side's measured SMs: a number, or {"smid_distinct": n, "timed_sms": x} (the %smid count
    first: it says which SMs ran; the timing is an estimate). None: not measured."""
    if isinstance(side, dict):
        return next((v for v in map(_num, (side.get("smid_distinct"), side.get("timed_sms"))) if v is not None), None)
    return _num(side)


def dropped_note(report: dict[str, Any]) -> str | None:
    """The levels the driver refused (`device.dropped_levels`), with its reasons; None if there are none."""
    dropped = [x for x in _list(_dict(report.get("device")).get("dropped_levels")) if isinstance(x, dict)]
    if not dropped:
        return None
    return "dropped: " + "; ".join(f"level {x.get('level')} {x.get('requested')} ({str(x.get('reason'))[:120]})"
                                   for x in dropped)


def realized(report: dict[str, Any]) -> tuple[Verdict, str]:
    """Every level of the table as requested (`device.levels_requested`) ran, with the SMs it asked for."""
    dropped = dropped_note(report)
    if dropped:
        return False, dropped
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    table = [_pair(x) for x in _list(_dict(report.get("device")).get("levels_requested"))]
    if not table:
        return None, "no requested table (device.levels_requested) to compare the levels with"
    pairs = [(x.get("level"), _pair(x.get("requested")), _pair(x.get("realized"))) for x in levels]
    if all(a is not None for _, a, _ in pairs) and [a for _, a, _ in pairs] != table:
        return False, f"the levels that ran ({len(levels)}) are not the table requested ({len(table)})"
    verdict = all3(None if a is None or b is None else a == b for _, a, b in pairs)
    off = [level for level, a, b in pairs if a is not None and b is not None and a != b]
    note = (f"levels {off} differ from what was requested" if off else f"{len(levels)} levels as requested"
            if verdict else "levels without requested or realized SMs")
    return verdict, note


def measured_sms(report: dict[str, Any]) -> tuple[Verdict, str]:
    """Each split level's `measured_sms` sides (prefill, decode) against its realized SMs, and its two
    sides on disjoint SMs (`shared_smids` 0). The end levels (one side 0) run on ordinary whole-device
    streams, with no green context to check; a GPU run with no split level has nothing isolated."""
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    total = _num(_dict(report.get("device")).get("sms"))
    split = [x for x in levels if _is_split(_pair(x.get("realized")))]
    if not split and _gpu(report) and all(_pair(x.get("realized")) for x in levels):
        return False, "no split level ran: prefill and decode never had SMs of their own" + (
            f" ({dropped_note(report)})" if dropped_note(report) else "")
    parts: list[Verdict] = [None for x in levels if _pair(x.get("realized")) is None]
    notes: list[str] = []
    for x in split:
        real = _pair(x.get("realized"))
        assert real is not None  # a split level
        m = _dict(x.get("measured_sms"))
        for side, want in zip(("prefill", "decode"), real, strict=True):
            got = measured_count(m.get(side))
            parts.append(None if got is None else abs(got - want) <= SM_TOLERANCE)
            if got is not None and abs(got - want) > SM_TOLERANCE:
                notes.append(f"level {x.get('level')} {side} {got:g} of {want:g}")
        if total is not None and sum(real) > total:  # an overlapped level: decode on the whole device, by design
            continue
        shared = _num(m.get("shared_smids"))
        parts.append(None if shared is None else shared == 0)
        if shared:
            notes.append(f"level {x.get('level')}'s sides share {shared:g} SMs")
    verdict = all3(parts)
    if verdict is None and not notes:
        missing = sum(p is None for p in parts)
        return None, (f"{missing} of {len(parts)} split level checks (sides, shared SMs) not measured" if split
                      else "no split levels")
    return verdict, "; ".join(notes) or f"{len(split)} split levels: each side within {SM_TOLERANCE} SMs, none shared"


def _flag(row: Any) -> Verdict:
    """A row's `graph_replayed`: its own, else that of the figures it holds (an overlap row's decode
    part, say), else None."""
    row = _dict(row)
    if isinstance(row.get("graph_replayed"), bool):
        return bool(row["graph_replayed"])
    inner = [v["graph_replayed"] for v in row.values() if isinstance(_dict(v).get("graph_replayed"), bool)]
    return all3(inner)


def graphs_replayed(report: dict[str, Any]) -> tuple[Verdict, str]:
    """On every level decode runs on with SMs of its own: `graph_replayed` of its decode figures (each
    split level's `overlap` row, the decode-side figures of `decode_step.graph` at its level, the
    whole-GPU figure for the last level), and, where the check compared them, the replayed graph's
    logits against the eager forward's (`levels[].graph_vs_eager.ok`). A level with no flag anywhere
    was not measured."""
    levels = _levels(report)
    if not levels:
        return None, "no levels in the report"
    flags: dict[Any, list[Verdict]] = {x.get("level"): [] for x in levels if (_pair(x.get("realized")) or (0, 0))[1]}
    graph = _dict(_dict(report.get("decode_step")).get("graph"))
    last = levels[-1].get("level")
    at = _dict(graph.get("level")).get("index")
    rows = [(last if where == "alone_whole_gpu" else at, row) for where, row in graph.items()
            if isinstance(row, dict) and "wall_ms" in row]
    rows += [(row.get("level"), row) for row in _list(report.get("overlap")) if isinstance(row, dict)]
    for level, row in rows:
        if level in flags:
            flags[level].append(_flag(row))
    wrong: list[Any] = []
    for x in levels:
        compared = x.get("graph_vs_eager")
        if x.get("level") in flags and isinstance(compared, dict):
            ok = compared.get("ok")
            flags[x.get("level")].append(ok if isinstance(ok, bool) else None)
            if ok is False:
                wrong.append(x.get("level"))
    per_level = {k: all3(v) for k, v in flags.items()}
    verdict = all3(per_level.values())
    eager = [k for k, v in per_level.items() if v is False and k not in wrong]
    unmeasured = [k for k, v in per_level.items() if v is None]
    notes = ([f"eager on levels {eager}"] if eager else []) + (
        [f"replayed logits differ from eager (or did not replay) on levels {wrong}"] if wrong else [])
    note = ("; ".join(notes) if notes else f"no graph_replayed for levels {unmeasured}" if unmeasured
            else f"replayed on {len(per_level)} levels")
    return verdict, note


def host_under_gpu(report: dict[str, Any]) -> tuple[Verdict, str]:
    row = _dict(_dict(_dict(report.get("decode_step")).get("graph")).get("alone_whole_gpu"))
    ratio = _num(row.get("host_over_gpu"))
    if ratio is None:
        return None, "no graph figure on the whole GPU"
    return ratio < HOST_OVER_GPU_MAX, f"host/gpu {ratio:.3f}"


def itl_ratio(report: dict[str, Any], base: str, limit: float) -> tuple[Verdict, str]:
    """pdmux's ITL p99 under prefill against `limit` x `itl_ms[base]`; not measured where pdmux ran on
    a GPU with no split level (its prefill and decode then only took turns on the whole device)."""
    itl = _dict(report.get("itl_ms"))
    pdmux, ref = _num(itl.get("pdmux_under_prefill")), _num(itl.get(base))
    if pdmux is None or ref is None or ref <= 0:
        show = {k: "none" if v is None else f"{v:.1f} ms" for k, v in (("pdmux_under_prefill", pdmux), (base, ref))}
        return None, ", ".join(f"{k} {v}" for k, v in show.items())
    ran = [_pair(g) for g in _list(_dict(_dict(report.get("policies")).get("pdmux")).get("levels"))]
    if _gpu(report) and ran and not any(map(_is_split, ran)):
        return None, f"pdmux ran with no split level ({pdmux:.1f} ms against {ref:.1f} ms)"
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
