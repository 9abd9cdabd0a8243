"""Live tuning: each split level of the dashboard's own engine tried in turn, scored as `pdtop tune` scores
a candidate (a handful of levels: every one is measured, no search is needed).

Each candidate is applied as a live override: a `Set` command through the dashboard's source,
the engine's validated control path (it shows on the ITL chart as a configuration change).
It is held for `settle_s` and then measured for `dwell_s` seconds of engine time from the events
that follow: ITL p99 over the decode batch's token gaps in the window (from the rounds, each gap
counted once per request in the batch, so requests still running count), TTFT p99 over the
requests that arrived and got their first token in it, the prefill throughput of those prompts,
and goodput as `pdtop tune` counts it over the requests that finish in it
(`pdtop.tune.score.score`). A candidate with no decode round in its window is unmeasured:
`keep()` refuses to keep it.

Candidates: one fixed split `[prefill, decode, 1]` per split level of the engine, the other
knobs as they were; the configuration in force is measured first. When every one is measured (or
its budget spent), `keep()` applies the best one, `rollback()` restores what was in force before,
the pinned level included. Nothing here imports Textual.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pdtop.analysis.metrics import percentile
from pdtop.engine.description import EngineConfig
from pdtop.engine.records import RequestRecord, RoundRecord
from pdtop.engine.scheduling.commands import AutoLevel, EngineCommand, PinLevel, Set
from pdtop.engine.scheduling.pdmux_config import SGLANG_KEYS, PdmuxConfig
from pdtop.telemetry.events import ConfigEvent
from pdtop.tune.score import RequestSample, Slo, covered_s, score
from pdtop.tune.search import Trial, best_trial

Send = Callable[[EngineCommand], Awaitable[Any]]
MAX_SAMPLES = 20_000  # requests (and round gaps) kept per window: bounded memory under any request rate


class NotMeasured(ValueError):
    """`keep()` was asked to keep a configuration no window measured."""


def pdmux_of(config: EngineConfig) -> PdmuxConfig:
    """The SGLang knobs of an engine's configuration (what a candidate sets)."""
    return PdmuxConfig(sm_group_num=config.sm_group_num, manual_divisions=[list(d) for d in config.manual_divisions],
                       split_forward_token_budget=config.split_forward_token_budget,
                       decode_bs_divisor=config.decode_bs_divisor, chunk_size=config.chunk_size,
                       max_split_forward_layers=config.max_split_forward_layers or 0,
                       overlap_decode_full_sm=bool(config.overlap_decode_full_sm),
                       chunked_prefill_size=config.chunked_prefill_size or 0)


def live_candidates(config: EngineConfig) -> list[PdmuxConfig]:
    """One fixed split per split level in force (prefill units ascending), other knobs unchanged."""
    base = pdmux_of(config)
    units = config.levels[0][0]
    prefill = sorted({p for p, d in config.levels if 0 < p < units})
    return [base.replace(sm_group_num=3, manual_divisions=[[p, units - p, 1]]) for p in prefill]


@dataclass
class _Window:
    start: float
    end: float
    samples: list[RequestSample] = field(default_factory=list)
    prompt_tokens: int = 0
    waits: list[tuple[float, float]] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    gaps: list[tuple[float, int]] = field(default_factory=list)  # (decode batch's token gap, batch size)
    last_decode: float | None = None

    def take_round(self, r: RoundRecord) -> None:
        if not self.start < r.time <= self.end or r.decode_bs == 0:
            return
        if self.last_decode is not None and len(self.gaps) < MAX_SAMPLES:
            self.gaps.append((r.time - self.last_decode, r.decode_bs))
        self.last_decode = r.time

    def itl_p99_s(self) -> float:
        return percentile([g for g, bs in self.gaps for _ in range(bs)], 99)

    def take(self, r: RequestRecord) -> None:
        if not self.start < r.time <= self.end or len(self.samples) >= MAX_SAMPLES:
            return
        if r.kind == "first_token" and r.ttft_s is not None and r.time - r.ttft_s >= self.start:
            self.prompt_tokens += r.prompt_tokens
            self.waits.append((r.time - r.ttft_s, r.time))
            self.ttfts.append(r.ttft_s)
        elif r.kind == "finish" and r.finish_reason != "rejected":
            ends = [r.time - s for s in itertools.accumulate(reversed(r.itls_s), initial=0.0)][::-1]
            gaps = [g for g, end in zip(r.itls_s, ends[1:], strict=True) if self.start < end]
            first = ends[0]
            self.samples.append(RequestSample(r.ttft_s if first >= self.start else None, gaps))


class LiveTune:
    """Run with `await run(progress)`; then `await keep()` or `await rollback()`."""

    def __init__(self, send: Send, config: EngineConfig, slo: Slo, dwell_s: float = 5.0, settle_s: float = 0.5,
                 budget_s: float = 120.0, wait_timeout_s: float = 30.0):
        self.send, self.previous, self.slo = send, config, slo
        self.dwell_s, self.settle_s, self.budget_s, self.wait_timeout_s = dwell_s, settle_s, budget_s, wait_timeout_s
        self.reference = pdmux_of(config)
        self.candidates = [c for c in live_candidates(config) if c != self.reference]
        self.trials: list[Trial] = []  # in the order they were measured
        self.current: PdmuxConfig | None = None  # the candidate being measured
        self.in_force = self.reference
        self.pinned_level = config.pinned_level  # in force on the engine
        self.now = 0.0  # engine clock of the latest round
        self.rounds = 0  # rounds seen (the clock is known once one came in)
        self.status = "starting"
        self._window: _Window | None = None
        self._applied: float | None = None
        self._changed = asyncio.Event()

    # ---- events in (the dashboard feeds every event it receives) --------------------------------

    def on_event(self, event: Any) -> None:
        if isinstance(event, RoundRecord):
            self.now, self.rounds = event.time, self.rounds + 1
            if self._window is not None:
                self._window.take_round(event)
            self._changed.set()
        elif isinstance(event, RequestRecord) and self._window is not None:
            self._window.take(event)
        elif isinstance(event, ConfigEvent):
            self.in_force, self.pinned_level = pdmux_of(event.config), event.config.pinned_level
            if self.current is not None and self._applied is None and self.in_force == self.current:
                self._applied = event.time
            self._changed.set()

    async def _until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.wait_timeout_s
        while not done():
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"live tuning: no {what} from the engine in {self.wait_timeout_s:g} s")
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    # ---- the run --------------------------------------------------------------------------------

    @property
    def best(self) -> Trial | None:
        return best_trial(self.trials, self.slo)

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        t0 = time.monotonic()
        if self.previous.pinned_level is not None:
            await self.send(AutoLevel())  # candidates need the automatic level choice
        await self._measure(self.reference, progress)
        for config in self.candidates:
            if time.monotonic() - t0 > self.budget_s:
                self.status = "budget spent"
                return
            await self._measure(config, progress)
        self.status = "done"

    async def _measure(self, config: PdmuxConfig, progress: Callable[[], None]) -> None:
        self.current, self._applied = config, None
        self.status = "applying"
        progress()
        changes = self._changes(config)
        if changes:
            await self.send(Set(**changes))
            await self._until(lambda: self._applied is not None, "configuration change")
        else:
            seen = self.rounds  # nothing to apply: the window starts at the next round, on the engine's clock
            await self._until(lambda: self.rounds > seen, "rounds")
            self._applied = self.now
        assert self._applied is not None
        window = _Window(self._applied + self.settle_s, self._applied + self.settle_s + self.dwell_s)
        self._window = window
        self.status = "measuring"
        progress()
        await self._until(lambda: self.now >= window.end, "rounds")
        self._window = None
        result = score(window.samples, self.slo, self.dwell_s, window.prompt_tokens, covered_s(window.waits))
        result = dataclasses.replace(result, itl_p99_s=window.itl_p99_s(), ttft_p99_s=percentile(window.ttfts, 99))
        self.trials.append(Trial(config, result, order=len(self.trials)))
        self.current = None
        progress()

    def _changes(self, config: PdmuxConfig) -> dict[str, Any]:
        now, new = self.in_force.to_dict(), config.to_dict()
        return {k: new[k] for k in SGLANG_KEYS if new[k] != now[k]}

    # ---- the operator's choice ------------------------------------------------------------------

    def measured(self, config: PdmuxConfig) -> bool:
        """Whether a window measured `config` (a decode round ran in it)."""
        return any(t.config == config and not math.isnan(t.result.itl_p99_s) for t in self.trials)

    async def keep(self) -> PdmuxConfig:
        """Apply the best configuration measured (the one in force before if none beat it); returns
        once the engine reports it in force (TimeoutError otherwise). Raises `NotMeasured`, changing
        nothing, when no window measured that configuration."""
        best = self.best.config if self.best is not None else self.reference
        if not self.measured(best):
            raise NotMeasured(f"{'the configuration before' if best == self.reference else 'the best'} was never "
                              f"measured: no decode ran in its {self.dwell_s:g} s window (measure longer)")
        await self._apply(best)
        return best

    async def rollback(self) -> None:
        """Restore the configuration in force before the tune, and its pinned level; returns once the
        engine reports both in force (TimeoutError otherwise)."""
        await self._apply(self.reference)
        level = self.previous.pinned_level
        if level is not None and self.pinned_level != level:
            await self.send(PinLevel(level))
            await self._until(lambda: self.pinned_level == level, f"pinned level {level}")

    async def _apply(self, config: PdmuxConfig) -> None:
        """Set every knob and wait for the engine's configuration event that shows them in force (a
        set that changes nothing is not reported, so nothing is awaited when they already are)."""
        values = config.to_dict()
        await self.send(Set(**{k: values[k] for k in SGLANG_KEYS}))
        await self._until(lambda: not self._changes(config), "configuration change")
