"""Where a slow decode step comes from: what ran beside each measured round (`pdtop bench --trace`).

A `RoundTracer` watches the bench's rounds and records, per decode step: the level and
whether it changed, the core sets the two worker threads are pinned to (and so their
OpenMP team sizes: one thread per core) and whether decode was re-pinned, what the
prefill side did during the decode step (milliseconds in attention and in the MLP, which
layers; told by the model runner's layer trace, `Executor.set_layer_trace`, for the
prefill work's layers), the garbage collections that ran, and the process's thread count.
`slow_step_report` then says which of these the slowest steps share.
"""
from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from pdtop.analysis.metrics import percentile
from pdtop.bench.policy_bench import Observer
from pdtop.engine.devices.cpu import CpuDevice
from pdtop.engine.engine import Engine
from pdtop.engine.records import RoundRecord


class RoundTracer(Observer):
    def __init__(self, engine: Engine):
        self._engine = engine
        self._gc: list[tuple[int, float, float]] = []  # (generation, start, end), perf_counter seconds
        self._gc_start = (0, 0.0)
        self._phases: list[tuple[str, int, float, float]] = []  # prefill work: (phase, layer, start, end)
        gc.callbacks.append(self._on_gc)
        engine.executor.set_layer_trace(self._on_layer)  # the simulator runs no layers: nothing is told

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = (info["generation"], time.perf_counter())
        else:
            self._gc.append((*self._gc_start, time.perf_counter()))

    def _on_layer(self, work: str, phase: str, layer: int, start: float, end: float) -> None:
        """The runner's layer trace, on the thread that ran the layer (the CPU device's prefill side for
        pdmux's prefill slices)."""
        if work == "prefill":
            self._phases.append((phase, layer, start, end))

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)
        self._engine.executor.set_layer_trace(None)

    def _where(self) -> dict[str, Any]:
        device = self._engine.device
        cores: dict[str, Any] = device.worker_cores() if isinstance(device, CpuDevice) else {}
        return {"level": self._engine.device.level, "cores": cores,
                "prefill": self._engine.scheduler.prefill_in_flight}

    def before_round(self, engine: Engine) -> None:
        self._before = self._where()
        self._t0 = time.perf_counter()
        del self._phases[:-64]  # only phases overlapping this round matter

    def after_round(self, engine: Engine, record: RoundRecord, decode_end: float | None = None) -> dict[str, Any]:
        t1 = time.perf_counter()
        after, before = self._where(), self._before
        cores = after["cores"]
        info: dict[str, Any] = {
            "level_changed": after["level"] != before["level"],
            "repinned": bool(cores) and cores.get("decode") != before["cores"].get("decode"),
            "decode_cores": list(cores.get("decode") or ()), "prefill_cores": list(cores.get("prefill") or ()),
            "prefill_started": after["prefill"] and not before["prefill"],
            "prefill_joined": before["prefill"] and not after["prefill"],
            "prefill_layers": [[p.layers_done, p.layers_total] for p in record.prefills],
            "gc": [[gen, (b - a) * 1e3] for gen, a, b in self._gc if b > self._t0 and a < t1],
            "threads": len(os.listdir("/proc/self/task")),
        }
        if decode_end is not None and not engine.device.virtual:  # the device clock is perf_counter
            d0 = decode_end - record.decode_step_s
            ms = {"attn": 0.0, "mlp": 0.0}
            layers = set()
            for phase, layer, a, b in self._phases:
                overlap = min(b, decode_end) - max(a, d0)
                if overlap > 0:
                    ms[phase] += overlap * 1e3
                    layers.add(layer)
            info.update(prefill_attn_ms=ms["attn"], prefill_mlp_ms=ms["mlp"], prefill_layers_run=sorted(layers))
        self._gc = [g for g in self._gc if g[2] > t1 - 10]
        return info


# (label, test on a trace row) for `slow_step_report`
ATTRIBUTES: list[tuple[str, Callable[[dict[str, Any], int], bool]]] = [
    ("level changed this round", lambda r, _: r["level_changed"]),
    ("decode re-pinned (team resized)", lambda r, _: r["repinned"]),
    ("prefill ran during the step", lambda r, _: r.get("prefill_attn_ms", 0) + r.get("prefill_mlp_ms", 0) > 0),
    ("  mostly attention", lambda r, _: r.get("prefill_attn_ms", 0) > r.get("prefill_mlp_ms", 0)),
    ("  mostly MLP", lambda r, _: r.get("prefill_mlp_ms", 0) > r.get("prefill_attn_ms", 0)),
    ("prefill started this round", lambda r, _: r["prefill_started"]),
    ("prefill finished this round", lambda r, _: r["prefill_joined"]),
    ("a long prompt in the batch", lambda r, long: r["contexts"][1] >= long),
    ("garbage collection in the round", lambda r, _: bool(r["gc"])),
    ("full collection (gen 2)", lambda r, _: any(g == 2 for g, _ in r["gc"])),
]


def slow_step_report(rows: list[dict[str, Any]], long_tokens: int, top: float = 90) -> str:
    """Per policy: how often each attribute holds among the slowest steps (ratio >= its p`top`) and
    among all steps, and the median interference of the steps with and without it."""
    lines = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy and r["ratio"] is not None and math.isfinite(r["ratio"])]
        if not mine:
            continue
        cut = percentile([r["ratio"] for r in mine], top)
        slow = [r for r in mine if r["ratio"] >= cut]
        lines.append(f"{policy}: {len(slow)} of {len(mine)} decode steps at interference >= {cut:.2f}x "
                     f"(the p{top:g}); slowest {max(r['ratio'] for r in mine):.2f}x")
        lines.append(f"  {'attribute':34}{'slow':>7}{'all':>7}{'median with':>13}{'without':>9}")
        for label, test in ATTRIBUTES:
            has = [r for r in mine if test(r, long_tokens)]
            without = [r for r in mine if not test(r, long_tokens)]

            def med(xs: list[dict[str, Any]]) -> str:
                return f"{statistics.median(x['ratio'] for x in xs):.2f}x" if xs else "-"

            share_slow = sum(test(r, long_tokens) for r in slow) / len(slow)
            lines.append(f"  {label:34}{share_slow:>7.0%}{len(has) / len(mine):>7.0%}{med(has):>13}{med(without):>9}")
    return "\n".join(lines)
