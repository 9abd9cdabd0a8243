"""The search behind `pdtop tune`: the PD multiplexing configuration that meets the SLOs with the
most goodput, and the Pareto front of ITL p99 against prefill throughput (a candidate's figures
and the SLOs are `score`'s).

A search space is a few families of grids (`Family`: ordered `Axis` values -> a `PdmuxConfig`).
`ParetoSearch` is a pattern search on them, driven by `ask`/`tell` so that the same search runs
offline (`run_search`) and live against a served engine:

1. a coarse grid: `coarse` values per axis, both ends included;
2. around every point on the front (and the best configuration, or the closest ones while none
   meets the SLOs), the neighbours at the current stride along each axis;
3. when no new neighbour is left, the strides halve; at stride 1 with nothing new, it is done.

Points that behave the same (`SearchSpace.key`, e.g. the same split for every decode batch size
the workload has) are measured once.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from pdtop.engine.errors import ConfigError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.tune.score import Measurement, Slo

Point = tuple[str, tuple[int, ...]]  # (family name, index into each of its axes)


# ---- the space ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[int, ...]  # ordered: neighbours are next to each other


@dataclass(frozen=True)
class Family:
    name: str
    axes: tuple[Axis, ...]
    make: Callable[[dict[str, int]], PdmuxConfig]  # {axis name: value} -> the configuration

    @property
    def size(self) -> int:
        return math.prod(len(a.values) for a in self.axes)


def config_key(config: PdmuxConfig) -> Hashable:
    return tuple((k, repr(v)) for k, v in config.to_dict().items())


def distance(config: PdmuxConfig, reference: PdmuxConfig) -> tuple[int, float]:
    """How far `config` is from `reference`: fields changed, then how much (log ratio of each number)."""
    a, b = config.to_dict(), reference.to_dict()
    changed = [k for k in a if a[k] != b[k]]
    return len(changed), sum(abs(math.log(a[k] / b[k])) if isinstance(a[k], int) and a[k] > 0 and b[k] else 1.0
                             for k in changed)


@dataclass
class SearchSpace:
    families: tuple[Family, ...]
    key: Callable[[PdmuxConfig], Hashable] = config_key  # same key: same behaviour, measured once

    def family(self, name: str) -> Family:
        return next(f for f in self.families if f.name == name)

    def config(self, point: Point) -> PdmuxConfig:
        fam = self.family(point[0])
        return fam.make({a.name: a.values[i] for a, i in zip(fam.axes, point[1], strict=True)})

    def point(self, family: str, **values: int) -> Point | None:
        """The grid point with these axis values, or None if one is not on its axis."""
        fam = self.family(family)
        if any(values[a.name] not in a.values for a in fam.axes):
            return None
        return family, tuple(a.values.index(values[a.name]) for a in fam.axes)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.families)


# ---- the front ------------------------------------------------------------------------------

@dataclass
class Trial:
    """A measured configuration, and every grid point that behaves as it does."""

    config: PdmuxConfig
    result: Measurement
    points: list[Point] = field(default_factory=list)


def _itl(t: Trial) -> float:
    return math.inf if math.isnan(t.result.itl_p99_s) else t.result.itl_p99_s


def _tok_s(t: Trial) -> float:
    return -math.inf if math.isnan(t.result.prefill_tok_s) else t.result.prefill_tok_s


def pareto_front(trials: Iterable[Trial]) -> list[Trial]:
    """The trials no other beats on both ITL p99 (lower) and prefill throughput (higher), by ITL."""
    front: list[Trial] = []
    for t in sorted(trials, key=lambda t: (_itl(t), -_tok_s(t))):
        if not front or _tok_s(t) > _tok_s(front[-1]):
            front.append(t)
    return front


def best_trial(trials: Iterable[Trial], slo: Slo) -> Trial | None:
    """The best goodput among the trials that meet the SLOs (then prefill throughput, then ITL)."""
    meeting = [t for t in trials if slo.met(t.result)]
    good = [t for t in meeting if not math.isnan(t.result.goodput_rps)]
    return max(good or meeting, key=lambda t: (t.result.goodput_rps if good else 0.0, _tok_s(t), -_itl(t)),
               default=None)


def closest_trials(trials: Iterable[Trial], slo: Slo, n: int = 3) -> list[Trial]:
    """The `n` trials nearest to meeting the SLOs."""
    return sorted(trials, key=lambda t: (slo.excess(t.result), -_tok_s(t)))[:n]


# ---- the search -----------------------------------------------------------------------------

class ParetoSearch:
    """`ask()` gives configurations to measure (empty: done); `tell()` takes each measurement.

    Of the configurations that behave the same, a trial shows the one nearest to `reference`.
    """

    def __init__(self, space: SearchSpace, slo: Slo, coarse: int = 3, reference: PdmuxConfig | None = None):
        self.space, self.slo, self.reference = space, slo, reference
        self.trials: dict[Hashable, Trial] = {}
        self.seen: dict[Point, Hashable | None] = {}  # None: the point is not a valid configuration
        self._pending: dict[Hashable, list[Point]] = {}  # asked, not told yet
        self.strides = {f.name: [max(1, (len(a.values) - 1) // max(1, coarse - 1)) for a in f.axes]
                        for f in space.families}
        self._started = False

    def tell(self, config: PdmuxConfig, result: Measurement) -> Trial:
        key = self.space.key(config)
        trial = self.trials.get(key)
        if trial is None:
            trial = self.trials[key] = Trial(config, result)
        trial.points += self._pending.pop(key, [])
        return trial

    def ask(self) -> list[PdmuxConfig]:
        self._pending.clear()  # asked before and never told: given up
        while True:
            points = self._neighbours() if self._started else self._coarse()
            self._started = True
            batch = self._resolve(points)
            if batch:
                return batch
            if not self._shrink():
                return []

    @property
    def front(self) -> list[Trial]:
        return pareto_front(self.trials.values())

    @property
    def best(self) -> Trial | None:
        return best_trial(self.trials.values(), self.slo)

    def _coarse(self) -> list[Point]:
        out = []
        for f, strides in ((f, self.strides[f.name]) for f in self.space.families):
            ranges = [sorted({*range(0, len(a.values), s), len(a.values) - 1}) for a, s in zip(f.axes, strides,
                                                                                                 strict=True)]
            out += [(f.name, idx) for idx in itertools.product(*ranges)]
        return out

    def _anchors(self) -> list[Trial]:
        trials = list(self.trials.values())
        best = self.best
        return self.front + ([best] if best is not None else closest_trials(trials, self.slo))

    def _neighbours(self) -> list[Point]:
        out = []
        for trial in self._anchors():
            for name, idx in trial.points:
                strides = self.strides[name]
                for axis, (i, s) in enumerate(zip(idx, strides, strict=True)):
                    last = len(self.space.family(name).axes[axis].values) - 1
                    for j in {max(0, i - s), min(last, i + s)} - {i}:
                        out.append((name, (*idx[:axis], j, *idx[axis + 1:])))
        return out

    def _resolve(self, points: Iterable[Point]) -> list[PdmuxConfig]:
        """Configurations of the points not seen before whose behaviour is new."""
        batch = []
        for p in points:
            if p in self.seen:
                continue
            try:
                config = self.space.config(p)
                key = self.space.key(config)
            except ConfigError:
                self.seen[p] = None
                continue
            self.seen[p] = key
            trial = self.trials.get(key)
            if trial is not None:
                trial.points.append(p)
                if self.reference is not None and distance(config, self.reference) < distance(trial.config,
                                                                                               self.reference):
                    trial.config = config
            elif key in self._pending:
                self._pending[key].append(p)
            else:
                self._pending[key] = [p]
                batch.append(config)
        return batch

    def _shrink(self) -> bool:
        """Halve every stride; False when all were 1 already."""
        if all(s == 1 for strides in self.strides.values() for s in strides):
            return False
        self.strides = {name: [max(1, s // 2) for s in strides] for name, strides in self.strides.items()}
        return True


@dataclass
class SearchRun:
    measured: int  # configurations measured
    points: int  # grid points covered (measured, or equivalent to one measured)
    elapsed_s: float
    complete: bool  # False: the budget ran out first


def run_search(search: ParetoSearch, evaluate: Callable[[PdmuxConfig], Measurement], budget_s: float = math.inf,
               progress: Callable[[Trial, float], None] | None = None,
               clock: Callable[[], float] = time.monotonic, longest_s: float = 0.0) -> SearchRun:
    """Measure what the search asks for until it is done or `budget_s` would be passed (a candidate is
    not started when the longest one so far, or `longest_s` measured before, would not finish in time)."""
    t0, longest, measured = clock(), longest_s, 0
    complete = True
    while complete and (batch := search.ask()):
        for config in batch:
            if clock() - t0 + longest > budget_s:
                complete = False
                break
            start = clock()
            trial = search.tell(config, evaluate(config))
            measured += 1
            longest = max(longest, clock() - start)
            if progress is not None:
                progress(trial, clock() - t0)
    points = sum(len(t.points) for t in search.trials.values())
    return SearchRun(measured, points, clock() - t0, complete)
