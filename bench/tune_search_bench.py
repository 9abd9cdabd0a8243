"""`tune --launch`'s adaptive search against the sweep it replaced: launches to the first configuration that
meets the SLOs, and the goodput of the one chosen against the best of the whole grid, on stand-in engines.

    .venv/bin/python bench/tune_search_bench.py [--seeds 5] [--json]

The stand-in engines answer for a configuration as a server would after a launch, with seeded noise (2% on
goodput, 1% on ITL and TTFT), from what the configuration does on the seed's scenario on an H100 (the
split chosen for the window's decode batch, and the layers a long prompt advances a slice):
- `one knob`: only the layers a slice matter: the SLOs are met in a band of 5 values (placed by the seed,
  away from SGLang's default);
- `two knobs`: the split's prefill SMs and the layers a slice interact: ITL grows with both, TTFT falls
  with their product, so only a narrow diagonal meets both SLOs (placed by the seed);
- `none`: nothing matters; every configuration meets the SLOs: the search must stop early and say so.

The adaptive search (`pdtop.tune.search`, SGLang 0.5.23's space) runs with live changes: a candidate with the
running server's SM counts is not a launch (as on `pdtop serve` or the SGLang plugin with `{control_port}`).
The sweep is `pdtop tune --launch`'s search before it (the pattern search of commit f24cddf, kept below as it
was, over the space it searched, newer keys included), which launched every candidate; it is run to its
end or 400 candidates. The grid's best is the stand-in's noise-free best over every behaviour of the space
(the response depends on the split and the slice only, so those are enumerated). Medians over the seeds;
nothing is asserted. Goal (issue 41): at most a third of the sweep's launches to the first configuration
meeting the SLOs, within 2% of the grid's best goodput.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pdtop.bench.policy_bench import SCENARIOS
from pdtop.engine.errors import ConfigError
from pdtop.engine.roofline.partition import arch_constraints
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable, prefill_layers_per_step, slice_layers
from pdtop.tune.score import Measurement, Slo
from pdtop.tune.search import AdaptiveSearch, run_search
from pdtop.tune.space import SGLANG_DEFAULT, pdmux_space, restart_key

SC = SCENARIOS["sim"]
LAYERS = 36
TABLE = SplitTable.for_gpu(132, 9, PdmuxConfig())
SWEEP_CAP = 400


def behaviour(config: PdmuxConfig) -> tuple[int, int]:
    """(prefill SMs of the split chosen for the window's first decode batch, layers a long prompt's slice)."""
    t = TABLE.rebuilt(config)
    prefill = t.groups[t.choose(SC.decode_bs, True, config)][0]
    layers = slice_layers(prefill_layers_per_step(SC.long_tokens, LAYERS, config.token_budget),
                          config.max_split_forward_layers, True)
    return prefill, layers


SPREAD = 0.015  # requests' own ITL and TTFT scatter this much (relative) around a configuration's figures


@dataclass
class Standin:
    """A stand-in engine: noise-free figures of a behaviour, and a seeded noisy measurement of them.
    `truth` gives (ITL p99 s, TTFT p99 s, requests/s); goodput is the requests/s that meet the SLOs, each
    request's figures scattered by `SPREAD` around the configuration's, so it falls off smoothly past them."""

    name: str
    truth: Callable[[int, int], tuple[float, float, float]]  # (prefill SMs, layers a slice) -> figures
    slo: Slo
    rng: random.Random

    def figures(self, prefill: int, layers: int) -> tuple[float, float, float]:
        itl, ttft, rate = self.truth(prefill, layers)
        slo_ttft = self.slo.ttft_s or math.inf

        def meets(value: float, limit: float) -> float:
            return 0.5 * math.erfc((value - limit) / (SPREAD * limit * math.sqrt(2)))

        return itl, ttft, rate * meets(itl, self.slo.itl_s) * meets(ttft, slo_ttft)

    def measure(self, config: PdmuxConfig) -> Measurement:
        itl, ttft, goodput = self.figures(*behaviour(config))
        g = self.rng.gauss
        return Measurement(itl * (1 + g(0, 0.01)), ttft * (1 + g(0, 0.01)), 10_000.0, goodput * (1 + g(0, 0.02)))

    def true_goodput(self, config: PdmuxConfig) -> float:
        return self.figures(*behaviour(config))[2]

    def grid_best(self) -> float:
        """The best noise-free goodput over every behaviour the spaces have: each split's prefill SMs (the
        rule's levels and every manual division) with every slice."""
        prefill = {g[0] for n in range(3, 9) for g in TABLE.rebuilt(PdmuxConfig(sm_group_num=n)).groups[1:-1]}
        prefill |= set(range(8, 125, 8))
        return max(self.figures(p, layers)[2] for p in prefill for layers in range(1, LAYERS + 1))


def standins(seed: int) -> list[Standin]:
    rng = random.Random(seed)
    center = rng.randint(15, 31)  # SGLang's default (8 layers a slice) misses the band

    def one(_p: int, layers: int) -> tuple[float, float, float]:
        miss = max(0, abs(layers - center) - 2)
        return (8.7 + 0.5 * miss) * 1e-3, 0.5, 10 + layers / 5

    itl_slo = rng.uniform(11.05, 11.6)  # with TTFT 500 ms: SGLang's default (80 prefill SMs, 8 layers) misses

    def two(p: int, layers: int) -> tuple[float, float, float]:
        itl = 8.0 + 0.04 * p + 0.03 * layers
        ttft = 200 + 20_000 / (p * (0.5 + layers / 36))
        return itl * 1e-3, ttft * 1e-3, 10 + p / 10 + layers / 5

    def none(_p: int, _layers: int) -> tuple[float, float, float]:
        return 9e-3, 0.5, 12.0

    return [Standin("one knob", one, Slo(9.2e-3, 1.0), random.Random(seed * 3 + 1)),
            Standin("two knobs", two, Slo(itl_slo * 1e-3, 0.5), random.Random(seed * 3 + 2)),
            Standin("none", none, Slo(10e-3, 1.0), random.Random(seed * 3 + 3))]


@dataclass
class StandinRunner:
    """The search's `Runner` on a stand-in: a server kept running takes live changes of what needs no restart."""

    standin: Standin
    deterministic: bool = False
    launches: int = 0
    measured: int = 0
    running: PdmuxConfig | None = None

    def live(self) -> PdmuxConfig | None:
        return self.running

    def fits(self, live: bool) -> bool:
        return self.measured < SWEEP_CAP

    def measure(self, config: PdmuxConfig, repeat: int) -> Measurement:
        if self.running is None or restart_key(self.running) != restart_key(config):
            self.launches += 1
        self.running, self.measured = config, self.measured + 1
        return self.standin.measure(config)


def adaptive(standin: Standin, seed: int) -> dict[str, Any]:
    runner = StandinRunner(standin)
    search = AdaptiveSearch(pdmux_space(TABLE, SC, LAYERS), standin.slo, seed)
    run = run_search(search, runner, SGLANG_DEFAULT)
    best = search.best
    return {"first": run.first_meeting, "launches": runner.launches, "candidates": runner.measured,
            "goodput": standin.true_goodput(best.config) if best else 0.0, "stop": run.stop}


# ---- the sweep before the adaptive search (commit f24cddf: search.ParetoSearch, space.pdmux_space) ----------

Point = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class Family:
    name: str
    axes: tuple[Axis, ...]
    make: Callable[[dict[str, int]], PdmuxConfig]


@dataclass
class SweepTrial:
    config: PdmuxConfig
    result: Measurement
    points: list[Point] = field(default_factory=list)


def sweep_best(trials: Iterable[SweepTrial], slo: Slo) -> SweepTrial | None:
    """`search.best_trial` of the time: the best goodput among those that meet the SLOs."""
    meeting = [t for t in trials if slo.met(t.result)]
    return max(meeting, key=lambda t: (t.result.goodput_rps, t.result.prefill_tok_s), default=None)


def sweep_space() -> tuple[tuple[Family, ...], Callable[[PdmuxConfig], Hashable]]:
    bs_range = range(SC.decode_bs, SC.decode_bs + SC.long_prompts + 1)
    total, budgets = TABLE.units, Axis("layers_per_round", tuple(range(1, LAYERS + 1)))
    caps = Axis("max_split_forward_layers", (0, 1, 2, 4))
    most = len(TABLE.rebuilt(PdmuxConfig(sm_group_num=256)).groups)
    divisors = {36} | {max(1, bs * m // level + e) for m in range(1, most - 1) for bs in bs_range
                       for level in range(1, m + 1) for e in (0, 1)}
    min_part, step = arch_constraints(9)

    def sliced(config: PdmuxConfig, v: dict[str, int]) -> PdmuxConfig:
        return config.replace(split_forward_token_budget=v["layers_per_round"] * SC.long_tokens,
                              max_split_forward_layers=v["max_split_forward_layers"])

    def manual(v: dict[str, int], overlap: bool = False) -> PdmuxConfig:
        p = v["prefill_units"]
        return sliced(PdmuxConfig(sm_group_num=3, manual_divisions=[[p, total - p, 1]],
                                  overlap_decode_full_sm=overlap), v)

    def key(config: PdmuxConfig) -> Hashable:
        t = TABLE.rebuilt(config)
        splits = tuple(t.groups[t.choose(bs, True, config)] for bs in bs_range)
        layers = prefill_layers_per_step(SC.long_tokens, LAYERS, config.token_budget)
        return splits, slice_layers(layers, config.max_split_forward_layers, True)

    prefill = Axis("prefill_units", tuple(range(min_part, total - min_part + 1, step)))
    return (Family("auto", (Axis("sm_group_num", tuple(range(3, most + 1))), Axis("decode_bs_divisor",
                                                                                   tuple(sorted(divisors))),
                            budgets, caps), lambda v: sliced(PdmuxConfig(sm_group_num=v["sm_group_num"],
                                                                         decode_bs_divisor=v["decode_bs_divisor"]), v)),
            Family("manual", (prefill, budgets, caps), manual),
            Family("overlap", (prefill, budgets, caps), lambda v: manual(v, overlap=True))), key


def pareto(trials: Iterable[SweepTrial]) -> list[SweepTrial]:
    front: list[SweepTrial] = []
    for t in sorted(trials, key=lambda t: (t.result.itl_p99_s, -t.result.prefill_tok_s)):
        if not front or t.result.prefill_tok_s > front[-1].result.prefill_tok_s:
            front.append(t)
    return front


class ParetoSearch:
    """The pattern search: a coarse grid, then neighbours of the front and the best at halving strides."""

    def __init__(self, slo: Slo, coarse: int = 3):
        self.families, self.key = sweep_space()
        self.slo = slo
        self.trials: dict[Hashable, SweepTrial] = {}
        self.seen: dict[Point, Hashable | None] = {}
        self.pending: dict[Hashable, list[Point]] = {}
        self.strides = {f.name: [max(1, (len(a.values) - 1) // max(1, coarse - 1)) for a in f.axes]
                        for f in self.families}
        self.started = False

    def family(self, name: str) -> Family:
        return next(f for f in self.families if f.name == name)

    def config(self, p: Point) -> PdmuxConfig:
        fam = self.family(p[0])
        return fam.make({a.name: a.values[i] for a, i in zip(fam.axes, p[1], strict=True)})

    def tell(self, config: PdmuxConfig, m: Measurement) -> SweepTrial:
        k = self.key(config)
        trial = self.trials.setdefault(k, SweepTrial(config, m))
        trial.points += self.pending.pop(k, [])
        return trial

    def ask(self) -> list[PdmuxConfig]:
        self.pending.clear()
        while True:
            points = self.neighbours() if self.started else self.coarse()
            self.started = True
            batch = self.resolve(points)
            if batch:
                return batch
            if all(s == 1 for strides in self.strides.values() for s in strides):
                return []
            self.strides = {n: [max(1, s // 2) for s in ss] for n, ss in self.strides.items()}

    def coarse(self) -> list[Point]:
        out = []
        for f in self.families:
            ranges = [sorted({*range(0, len(a.values), s), len(a.values) - 1})
                      for a, s in zip(f.axes, self.strides[f.name], strict=True)]
            out += [(f.name, idx) for idx in itertools.product(*ranges)]
        return out

    def neighbours(self) -> list[Point]:
        trials = list(self.trials.values())
        best = sweep_best(trials, self.slo)
        anchors = pareto(trials) + ([best] if best is not None else
                                    sorted(trials, key=lambda t: self.slo.excess(t.result))[:3])
        out = []
        for trial in anchors:
            for name, idx in trial.points:
                for axis, (i, s) in enumerate(zip(idx, self.strides[name], strict=True)):
                    last = len(self.family(name).axes[axis].values) - 1
                    for j in {max(0, i - s), min(last, i + s)} - {i}:
                        out.append((name, (*idx[:axis], j, *idx[axis + 1:])))
        return out

    def resolve(self, points: Iterable[Point]) -> list[PdmuxConfig]:
        batch = []
        for p in points:
            if p in self.seen:
                continue
            try:
                config = self.config(p)
                k = self.key(config)
            except ConfigError:
                self.seen[p] = None
                continue
            self.seen[p] = k
            if k in self.trials:
                self.trials[k].points.append(p)
            elif k in self.pending:
                self.pending[k].append(p)
            else:
                self.pending[k] = [p]
                batch.append(config)
        return batch


def sweep(standin: Standin) -> dict[str, Any]:
    """As `tune --launch` ran it: SGLang's default launched twice (the noise), then each candidate launched."""
    search = ParetoSearch(standin.slo)
    launches, first = 0, None

    def launch(config: PdmuxConfig) -> Measurement:
        nonlocal launches, first
        launches += 1
        m = standin.measure(config)
        if first is None and standin.slo.met(m):
            first = launches
        return m

    default = SGLANG_DEFAULT
    search.tell(default, launch(default))
    launch(default)
    done = False
    while not done and (batch := search.ask()):
        for config in batch:
            if launches >= SWEEP_CAP:
                done = True
                break
            search.tell(config, launch(config))
    best = sweep_best(search.trials.values(), standin.slo)
    return {"first": first, "launches": launches, "candidates": launches,
            "goodput": standin.true_goodput(best.config) if best else 0.0, "stop": "done" if not done else "cap"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for seed in range(args.seeds):
        for standin in standins(seed):
            grid = standin.grid_best()
            for method, run in (("adaptive", adaptive), ("sweep", lambda s, _seed: sweep(s))):
                standin.rng.seed(seed * 7 + (method == "sweep"))
                r = run(standin, seed)
                r["of_grid_best"] = r["goodput"] / grid if grid else 1.0
                rows.setdefault(standin.name, {}).setdefault(method, []).append(r)
    elapsed = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"seeds": args.seeds, "rows": rows, "elapsed_s": elapsed, "loadavg": os.getloadavg()}))
        return

    def med(rs: list[dict[str, Any]], k: str) -> float:
        values = [math.inf if r[k] is None else r[k] for r in rs]
        return statistics.median(values)

    print(f"tune search: {args.seeds} seeds, medians [min-max]; load average {load0[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}, {elapsed:.0f} s")
    print(f"{'engine':<10} {'method':<9} {'launches to 1st SLO-meeting':>28} {'launches':>9} {'candidates':>11} "
          f"{'goodput / grid best':>20}  stops")
    for name, methods in rows.items():
        for method, rs in methods.items():
            firsts = [math.inf if r["first"] is None else r["first"] for r in rs]
            kinds = [r["stop"].split(" in ")[0] for r in rs]  # "no gain beyond the noise in 40 candidates ..."
            stops = [f"{k} x{kinds.count(k)}" for k in sorted(set(kinds))]
            print(f"{name:<10} {method:<9} {med(rs, 'first'):>14g} [{min(firsts):g}-{max(firsts):g}]".ljust(49)
                  + f"{med(rs, 'launches'):>9g} {med(rs, 'candidates'):>11g} "
                  f"{med(rs, 'of_grid_best') * 100:>12.1f}% [{min(r['of_grid_best'] for r in rs) * 100:.0f}-"
                  f"{max(r['of_grid_best'] for r in rs) * 100:.0f}]  {', '.join(stops)}")
        a, s = methods["adaptive"], methods["sweep"]
        ratio = med(a, "first") / med(s, "first") if med(s, "first") not in (0, math.inf) else math.nan
        print(f"{'':<10} adaptive/sweep launches to the first: {ratio:.2f} (goal <= 0.33); adaptive goodput "
              f"{med(a, 'of_grid_best') * 100:.1f}% of the grid's best (goal >= 98%)")


if __name__ == "__main__":
    main()
