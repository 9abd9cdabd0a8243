"""Which level runs while prefill and decode share the device: SGLang's rule, or one that meets an
ITL SLO online (`level_rule: slo` with `slo_itl_ms`, pdtop's own keys; SGLang reads neither).

SGLang's rule is linear in the decode batch (`splits.choose`). The PD-multiplexing paper (arXiv
2504.14489) instead gives decode just enough SMs to meet the ITL SLO and the rest to prefill.
`SloRule` does that from a model it learns as the engine runs (`DecodeStepModel`):

- **The model:** a (ridge) least-squares fit of the decode step time `a + b * decode_bs + c * context`
  (the decode batch's KV tokens: a round's used KV less the prompts being prefilled beside it,
  which decode does not read) over the whole device's decode-only rounds (the baseline), and per decode-unit count the
  median ratio of its rounds beside a prefill to that baseline (so the contention of the prefill
  beside it is in the ratio). A level with too few rounds of its own is predicted as the baseline
  scaled by `units / decode_units` (pessimistic: decode is bandwidth-bound and gains less than
  linearly from units) from the nearest level with more decode units that has rounds of its own
  (or from the baseline, times the worst contention measured so far). A level so predicted to
  meet the SLO is safe to try, and its rounds then teach the model its own ratio.
- **The choice,** wherever SGLang's rule would choose (every round no prefill slice is in flight,
  so it is re-checked after every prefill): the split level with the fewest decode units whose
  predicted step meets the SLO with the margin to spare, so prefill gets the most units; none: the
  most decode units.
- **The margin** is the model's own error, measured online: each round beside a prefill at a
  level with rounds of its own, the measured step over the step predicted for it before it ran;
  the margin is the 99th percentile of that ratio, minus 1, kept in `[MIN_MARGIN, MAX_MARGIN]`,
  and `MARGIN` while fewer than `MIN_SAMPLES` rounds were checked.
- **The slice** (`slice_layers`): where the level chosen has rounds of its own, prefill advances
  as many layers at once (up to all it has left) as keep the decode step predicted at that level
  within the SLO and margin until the slice ends, the batch's context growing by its batch size a
  round (during a prefill no request joins decode). The slice's time comes from this prefill's
  pace so far (unit-seconds a layer, spread over the level's prefill units), so its first slice,
  and any slice while the model is unsure, is SGLang's (`split_forward_token_budget`,
  `max_split_forward_layers`). Splitting serves only to choose the level again sooner; a level
  the model trusts needs no early re-check.
- **The fallback:** while the baseline has fewer than `MIN_SAMPLES` rounds, SGLang's rule, and
  `status` says so.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pdtop.engine.scheduling.splits import SplitTable

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pdtop.engine.records import RoundRecord
    from pdtop.engine.request import Request
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

MIN_SAMPLES = 8  # rounds a fit needs
WINDOW = 128  # rounds kept per decode-unit count (the newest)
RIDGE = 1.0  # per round, on the slopes: a batch size that varies by one or two gets almost none
MARGIN = 0.10  # a level meets the SLO when its predicted step is <= (1 - margin) * SLO; this until errors are known
MIN_MARGIN, MAX_MARGIN = 0.02, 0.5  # the measured margin's bounds
ERROR_PERCENTILE = 99


def decode_context(running: Iterable[Request]) -> int:
    """The KV tokens a decode step reads: its requests' contexts."""
    return sum(r.context_len for r in running)


def round_context(record: RoundRecord) -> int:
    """A round's decode context: its used KV less the prompts being prefilled beside it."""
    return max(0, record.kv_used_tokens - sum(p.tokens for p in record.prefills))


@dataclass
class StepFit:
    """A ridge fit of decode step seconds on (1, decode_bs, context tokens / 1000): the weights
    read once, a cost per request, the KV read per token. The slopes are held back a little, so a
    batch size or context that never varied gets no slope (extrapolating it would be a guess)."""

    coef: np.ndarray
    floor_s: float  # half the fastest step seen: a prediction never goes below it

    def predict(self, bs: int, ctx: int) -> float:
        return max(self.floor_s, float(self.coef @ np.array([1.0, bs, ctx / 1000.0])))


def fit(rows: deque[tuple[int, int, float]]) -> StepFit | None:
    if len(rows) < MIN_SAMPLES:
        return None
    a = np.array([[1.0, bs, ctx / 1000.0] for bs, ctx, _ in rows])
    t = np.array([s for _, _, s in rows])
    ridge = RIDGE * len(rows) * np.diag([0.0, 1.0, 1.0])  # the intercept is not held back
    coef = np.linalg.solve(a.T @ a + ridge, a.T @ t)
    return StepFit(coef, float(t.min()) / 2)


@dataclass
class DecodeStepModel:
    """Decode step times learned from the rounds the engine runs, keyed by decode units (not level
    index: a new table keeps what was learned about a unit count).

    The whole device's decode-only rounds give the baseline `fit_alone(bs, ctx)`; each split
    level's rounds beside a prefill give its ratio to that baseline (the median over its window),
    which holds both its fewer units and the prefill's contention. The ratio is robust where a fit
    per level is not: within a level the batch and context barely vary."""

    units: int
    beside_prefill: dict[int, deque[tuple[int, int, float]]] = field(default_factory=dict)
    alone: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _alone_fit: StepFit | None = None
    _stale: bool = True

    def observe(self, record: RoundRecord) -> None:
        """Learn from a round: a pdmux decode step beside a prefill, or a decode-only step on the
        whole device (under pdmux or prefill-first: the same step)."""
        if record.policy == "chunked" or not record.decode_bs or record.decode_step_s <= 0:
            return
        row = (record.decode_bs, round_context(record), record.decode_step_s)
        if record.prefills and record.prefill_units > 0 and record.policy == "pdmux":
            self.beside_prefill.setdefault(record.decode_units, deque(maxlen=WINDOW)).append(row)
        elif record.decode_units == self.units and record.prefill_units == 0:
            self.alone.append(row)
            self._stale = True

    def fit_alone(self) -> StepFit | None:
        if self._stale:
            self._alone_fit, self._stale = fit(self.alone), False
        return self._alone_fit

    @property
    def samples(self) -> int:
        return len(self.alone) + sum(len(r) for r in self.beside_prefill.values())

    def ratio(self, decode_units: int) -> float | None:
        """A split level's step over the baseline's, beside a prefill, from its rounds whose context
        is within the baseline's range (+-25%: the fit is not stretched far); None with too few."""
        base, rows = self.fit_alone(), self.beside_prefill.get(decode_units)
        if base is None or rows is None:
            return None
        low, high = 0.75 * min(c for _, c, _ in self.alone), 1.25 * max(c for _, c, _ in self.alone)
        near = [s / base.predict(bs, ctx) for bs, ctx, s in rows if low <= ctx <= high]
        return float(np.median(near)) if len(near) >= MIN_SAMPLES else None

    def contention(self) -> float:
        """The worst measured ratio over the one unit-scaling would give (1 if none is known)."""
        known = [r * d / self.units for d in self.beside_prefill if (r := self.ratio(d)) is not None]
        return max([1.0, *known])

    def predict(self, decode_units: int, bs: int, ctx: int) -> tuple[float, bool]:
        """Predicted decode step beside a prefill, and whether the level's own rounds back it
        (NaN when the baseline is not known yet). Unvisited: the nearest level with more decode
        units and rounds of its own, scaled by its units / these (pessimistic for bandwidth-bound
        decode); with none, the baseline so scaled times the worst contention seen."""
        base = self.fit_alone()
        if base is None:
            return math.nan, False
        r = self.ratio(decode_units)
        if r is not None:
            return base.predict(bs, ctx) * r, True
        known = sorted(d for d in self.beside_prefill if d > decode_units and self.ratio(d) is not None)
        if known:
            d = known[0]
            return base.predict(bs, ctx) * (self.ratio(d) or 0.0) * d / decode_units, False
        return base.predict(bs, ctx) * self.units / decode_units * self.contention(), False


@dataclass
class PrefillPace:
    """The in-flight prefill's pace: prefill unit-seconds per layer done (rounds it was in, each
    round's seconds times the prefill units it had). pdmux tells it after each round."""

    key: tuple[object, ...] = ()  # which prefill: its requests, the chunk's first token (None: whole), tokens
    unit_s: float = 0.0
    layers: int = 0

    def add(self, key: tuple[object, ...], unit_s: float, layers: int) -> None:
        """A round of prefill `key`: `unit_s` unit-seconds, after which `layers` of its layers are done."""
        if key != self.key:
            self.key, self.unit_s = key, 0.0
        self.unit_s += unit_s
        self.layers = layers

    def layer_s(self, prefill_units: int) -> float | None:
        return self.unit_s / self.layers / prefill_units if self.layers > 0 and prefill_units > 0 else None


@dataclass
class SloRule:
    """The level choice of pdmux rounds; `status` says what the last choice rested on."""

    model: DecodeStepModel
    status: str = "SGLang's rule"
    predicted_s: dict[int, float] = field(default_factory=dict)  # decode units -> predicted step, last choice
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # measured / predicted steps
    pace: PrefillPace = field(default_factory=PrefillPace)
    chosen: tuple[int, int, int, int] | None = None  # this round's trusted choice: (prefill, decode units, bs, ctx)

    @property
    def margin(self) -> float:
        """The share of the SLO a prediction must leave: the model's measured error (module doc)."""
        if len(self.errors) < MIN_SAMPLES:
            return MARGIN
        return min(MAX_MARGIN, max(MIN_MARGIN, float(np.percentile(self.errors, ERROR_PERCENTILE)) - 1.0))

    def learn(self, record: RoundRecord, config: PdmuxConfig, table: SplitTable) -> None:
        """After each round: under level_rule slo the model's prediction for it is checked (the prefill's
        pace is kept by pdmux, `PrefillPace`); the model learns from it, and under level_rule slo the
        record gets the model's step per level (`RoundRecord.predicted_steps_s`)."""
        self.chosen = None  # a choice holds for the slice submitted in its own round
        if config.level_rule == "slo" and record.policy == "pdmux" and record.prefills and record.prefill_units \
                and record.decode_bs and record.decode_step_s > 0:
            p, own = self.model.predict(record.decode_units, record.decode_bs, round_context(record))
            if own and p > 0:
                self.errors.append(record.decode_step_s / p)
        self.model.observe(record)
        record.predicted_steps_s = self.predicted(config, table)

    def slice_layers(self, k: int, done: int, num_layers: int, config: PdmuxConfig) -> int:
        """Layers of the next prefill slice after the `done` submitted, `k` being SGLang's: under
        level_rule slo, with a trusted choice this round and the prefill's pace known (not its first
        slice), the most of the layers left over which the chosen level's predicted decode step stays
        within the SLO and margin (module doc)."""
        c, slo, left = self.chosen, config.slo_itl_ms, num_layers - done
        layer_s = self.pace.layer_s(c[0]) if c is not None and done > 0 else None
        if config.level_rule != "slo" or slo is None or c is None or layer_s is None or left <= 1:
            return k
        _, d, bs, ctx = c
        goal = (1 - self.margin) * slo / 1e3

        def meets(n: int) -> bool:
            step, _ = self.model.predict(d, bs, ctx)
            return self.model.predict(d, bs, ctx + int(bs * n * layer_s / step))[0] <= goal

        if meets(left):
            return left
        lo, hi = 0, left  # meets(lo) (0: no slice), not meets(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
        return max(lo, 1)  # none: one layer, so the level is checked again soonest

    def predicted(self, config: PdmuxConfig, table: SplitTable) -> list[float | None] | None:
        """Under level_rule slo, per level of `table`, the step the last choice predicted (None where
        there is none: the whole-device levels, unknown ones); None under SGLang's rule."""
        if config.level_rule != "slo" or not self.predicted_s:
            return None
        out: list[float | None] = [None] * len(table.groups)
        for i in range(1, len(table.groups) - 1):
            p = self.predicted_s.get(table.groups[i][1])
            out[i] = None if p is None or math.isnan(p) else p
        return out

    def choose(self, table: SplitTable, decode_bs: int, has_prefill: bool, config: PdmuxConfig, ctx: int) -> int:
        sglang = table.choose(decode_bs, has_prefill, config)
        if config.level_rule != "slo" or config.slo_itl_ms is None:
            self.status = "SGLang's rule"
            return sglang
        if not (decode_bs and has_prefill):  # nothing to split: the whole device to the busy side
            if not self.status.startswith(("slo", "SGLang's rule until")):
                self.status = "slo: one side idle, the whole device to the other"
            return sglang
        slo = config.slo_itl_ms / 1e3
        splits = range(1, len(table.groups) - 1)  # prefill-heaviest first: decode units grow
        pred = {i: self.model.predict(table.groups[i][1], decode_bs, ctx) for i in splits}
        self.predicted_s = {table.groups[i][1]: p for i, (p, _) in pred.items()}
        if all(math.isnan(p) for p, _ in pred.values()):
            self.status = f"SGLang's rule until the model has {MIN_SAMPLES} rounds ({self.model.samples} so far)"
            return sglang
        margin = self.margin
        meeting = [i for i, (p, _) in pred.items() if p <= (1 - margin) * slo]
        if not meeting:
            self.status = f"slo: no level meets {config.slo_itl_ms:g} ms; the most decode units"
            return splits[-1]
        level = meeting[0]
        p, own = pred[level]
        if own:
            self.chosen = (table.groups[level][0], table.groups[level][1], decode_bs, ctx)
        how = "" if own else " (scaled from a level with more decode units: no rounds of its own yet)"
        self.status = (f"slo: level {level} predicted {p * 1e3:.2f} ms <= {config.slo_itl_ms:g} ms "
                       f"less {margin:.0%}{how}")
        return level
