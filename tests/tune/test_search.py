"""The search on synthetic cost landscapes: it finds the known optimum without measuring the whole grid."""
from __future__ import annotations

import math

from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.tune.score import Measurement, Slo
from pdtop.tune.search import Axis, Family, ParetoSearch, SearchSpace, Trial, pareto_front, run_search

SLO = Slo(itl_s=14.5e-3)


def _space(key=None) -> SearchSpace:
    """x: 0..40 (decode_bs_divisor x + 1), y: 0..30 (budget (y + 1) KiB tokens)."""
    fam = Family("xy", (Axis("x", tuple(range(41))), Axis("y", tuple(range(31)))),
                 lambda v: PdmuxConfig(decode_bs_divisor=v["x"] + 1, split_forward_token_budget=(v["y"] + 1) * 1024))
    return SearchSpace((fam,), key) if key else SearchSpace((fam,))


def _xy(config: PdmuxConfig) -> tuple[int, int]:
    return config.decode_bs_divisor - 1, config.split_forward_token_budget // 1024 - 1


def _landscape(config: PdmuxConfig) -> Measurement:
    """More x: more prefill throughput and more ITL; throughput peaks at y = 17. The SLO (14.5 ms)
    allows x <= 19, so the best goodput is at (19, 17): on no coarse grid line."""
    x, y = _xy(config)
    itl = (5 + 0.5 * x) * 1e-3
    tok_s = 2000 + 1000 * x - 40 * (y - 17) ** 2
    goodput = tok_s / 1000 if itl <= SLO.itl_s else 0.0
    return Measurement(itl_p99_s=itl, ttft_p99_s=0.5, prefill_tok_s=tok_s, goodput_rps=goodput)


def test_search_finds_the_known_optimum_measuring_a_fraction_of_the_grid():
    calls = []

    def evaluate(config):
        calls.append(_xy(config))
        return _landscape(config)

    search = ParetoSearch(_space(), SLO)
    run = run_search(search, evaluate)
    assert run.complete
    assert _xy(search.best.config) == (19, 17)
    assert len(calls) == len(set(calls)) == run.measured  # nothing measured twice
    assert run.measured < 41 * 31 / 4, run.measured
    # the front is the true one: for each x, its best y (17); ITL rises with x, so every x is on it
    assert sorted(_xy(t.config) for t in search.front) == [(x, 17) for x in range(41)]


def test_configurations_that_behave_the_same_are_measured_once():
    """A key that ignores x below 10: those points share one measurement."""
    calls = []

    def key(config):
        x, y = _xy(config)
        return max(x, 10), y

    def evaluate(config):
        calls.append(key(config))
        return _landscape(PdmuxConfig(decode_bs_divisor=max(_xy(config)[0], 10) + 1,
                                      split_forward_token_budget=config.split_forward_token_budget))

    search = ParetoSearch(_space(key), SLO)
    run_search(search, evaluate)
    assert len(calls) == len(set(calls))
    assert _xy(search.best.config) == (19, 17)
    assert sum(len(t.points) for t in search.trials.values()) > len(calls)


def test_budget_stops_the_search_before_a_candidate_would_pass_it():
    now = [0.0]

    def evaluate(config):
        now[0] += 1.0  # each candidate takes one second on this clock
        return _landscape(config)

    search = ParetoSearch(_space(), SLO)
    run = run_search(search, evaluate, budget_s=5.0, clock=lambda: now[0])
    assert not run.complete and run.measured == 5 and run.elapsed_s == 5.0


def test_pareto_front_keeps_the_undominated():
    def trial(itl_ms, tok_s):
        return Trial(PdmuxConfig(), Measurement(itl_ms / 1e3, 0.1, tok_s, 0.0))

    a, b, c, d, e = trial(10, 100), trial(12, 300), trial(11, 90), trial(12, 250), trial(20, 300)
    assert pareto_front([e, d, c, b, a]) == [a, b]
    unmeasured = trial(math.nan, 500)  # no ITL: ranked as the worst ITL
    assert pareto_front([unmeasured, a]) == [a, unmeasured]
