"""The adaptive search on synthetic landscapes over SGLang's real space for a simulated H100: it finds the
known optimum measuring a fraction of the grid, measures a behaviour once, fixes knobs whose effect is within
the noise (and stops when none matters), keeps a live server's SM counts while it can, and resumes a study
stored on disk. The landscapes are the figures a stand-in engine would report for a configuration."""
from __future__ import annotations

import dataclasses
import math
import random

from pdtop.bench.policy_bench import SCENARIOS
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.tune.score import Measurement, Slo
from pdtop.tune.search import AdaptiveSearch, Trial, pareto_front, run_search, score
from pdtop.tune.space import SGLANG_DEFAULT, pdmux_space, restart_key

SC = SCENARIOS["sim"]
TABLE = SplitTable.for_gpu(132, 9, PdmuxConfig())
SLO = Slo(itl_s=10e-3)


def space():
    return pdmux_space(TABLE, SC, 36)


def decode_sms(config: PdmuxConfig) -> int:
    t = TABLE.rebuilt(config)
    return t.groups[t.choose(SC.decode_bs, True, config)][1]


def landscape(config: PdmuxConfig) -> Measurement:
    """ITL falls with decode's SMs, prefill throughput rises with prefill's and with layers a slice: the
    best goodput is the fewest decode SMs that meet the SLO (60 of 132), in one slice."""
    d = decode_sms(config)
    itl = 1.0 / (d + 40)
    layers = min(36, max(1, config.token_budget // SC.long_tokens))
    tok_s = 20_000 * (132 - d) / 132 * (0.7 + 0.3 * layers / 36)
    return Measurement(itl, 0.5, tok_s, tok_s / 1000 if itl <= SLO.itl_s else 0.0)


@dataclasses.dataclass
class Runner:
    """Measures with a function; a 'server' holds the configuration's SM counts when `live_capable`."""

    f: object
    deterministic: bool = True
    live_capable: bool = False
    budget: int = 1000
    launches: int = 0
    calls: list = dataclasses.field(default_factory=list)
    running: PdmuxConfig | None = None

    def live(self):
        return self.running if self.live_capable else None

    def fits(self, live):
        return len(self.calls) < self.budget

    def measure(self, config, repeat):
        if self.running is None or restart_key(self.running) != restart_key(config):
            self.launches += 1
        self.running = config
        self.calls.append(config)
        return self.f(config)


def test_the_search_finds_the_known_optimum_measuring_a_fraction_of_the_grid():
    sp = space()
    search = AdaptiveSearch(sp, SLO, seed=1)
    runner = Runner(landscape)
    run = run_search(search, runner, SGLANG_DEFAULT)
    best = search.best
    assert best is not None and decode_sms(best.config) == 60
    assert best.result.goodput_rps >= 0.98 * landscape(SGLANG_DEFAULT.replace(
        sm_group_num=3, manual_divisions=[[72, 60, 1]], split_forward_token_budget=36 * SC.long_tokens)).goodput_rps
    assert run.measured == len(runner.calls) < 120 and sp.size > 100_000
    assert run.first_meeting is not None and run.first_meeting <= 20
    keys = [sp.key(c) for c in runner.calls]
    assert len(keys) == len(set(keys))  # no behaviour measured twice (a deterministic runner)


def test_the_roofline_guess_is_measured_second():
    runner = Runner(landscape)
    guess = PdmuxConfig(sm_group_num=3, manual_divisions=[[72, 60, 1]], split_forward_token_budget=36 * SC.long_tokens)
    run_search(AdaptiveSearch(space(), SLO, seed=1), runner, SGLANG_DEFAULT, guess)
    assert runner.calls[:2] == [SGLANG_DEFAULT, guess]


def noisy(f, sigma: float, seed: int = 0):
    rng = random.Random(seed)

    def g(config):
        m = f(config)
        return dataclasses.replace(m, goodput_rps=m.goodput_rps * (1 + rng.gauss(0, sigma)))
    return g


def test_when_no_knob_matters_it_stops_early_and_says_so():
    flat = noisy(lambda c: Measurement(9e-3, 0.5, 10_000.0, 10.0), 0.02)
    runner = Runner(flat, deterministic=False)
    search = AdaptiveSearch(space(), SLO, seed=0)
    run = run_search(search, runner, SGLANG_DEFAULT)
    assert run.stop == "no knob matters", (run.stop, len(runner.calls))
    assert len(runner.calls) <= 30  # of a grid of 300,000 points
    assert search.noise > 0 and search.nothing_mattered()
    assert all(e.within_noise for e in run.effects)


def test_a_knob_within_noise_is_fixed_while_the_one_that_matters_varies():
    """Goodput depends on the layers a slice only; the SLO is always met."""
    def one(config):
        layers = min(36, max(1, config.token_budget // SC.long_tokens))
        return Measurement(9e-3, 0.5, 1000.0 * layers, float(layers))
    search = AdaptiveSearch(space(), SLO, seed=2)
    runner = Runner(noisy(one, 0.01), deterministic=False)
    run = run_search(search, runner, SGLANG_DEFAULT)
    effects = {e.knob: e for e in run.effects}
    assert effects["layers_per_round"].effect > 5 and effects["layers_per_round"].fixed in (None, 36)
    best = search.best
    assert best is not None and min(36, best.config.token_budget // SC.long_tokens) >= 33


def test_a_live_server_keeps_its_sm_counts_for_a_few_candidates():
    runner = Runner(landscape, live_capable=True)
    run_search(AdaptiveSearch(space(), SLO, seed=3), runner, SGLANG_DEFAULT, live_trials=4)
    assert runner.launches < len(runner.calls) / 2, (runner.launches, len(runner.calls))


def test_a_stored_study_goes_on_where_it_stopped(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = str(tmp_path / "runs.jsonl.optuna")
    first = Runner(landscape, budget=10)
    run_search(AdaptiveSearch(space(), SLO, 4, JournalStorage(JournalFileBackend(path)), "s"), first, SGLANG_DEFAULT)
    second = Runner(landscape, budget=10)
    search = AdaptiveSearch(space(), SLO, 4, JournalStorage(JournalFileBackend(path)), "s")
    assert len(search.trials) == 10
    run_search(search, second, SGLANG_DEFAULT)
    assert SGLANG_DEFAULT not in second.calls and len(second.calls) == 10  # the default came from the study
    keys = {space().key(c) for c in first.calls}
    assert not keys & {space().key(c) for c in second.calls}


def test_the_score_ranks_every_configuration_meeting_the_slos_first():
    met, missed = Measurement(9e-3, 0.5, 100.0, 0.5), Measurement(10.1e-3, 0.5, 90_000.0, 30.0)
    assert score(met, SLO) > score(missed, SLO) > score(Measurement(20e-3, 0.5, 1.0, 0.0), SLO)
    assert score(Measurement(math.nan, math.nan, math.nan, math.nan), SLO) < score(missed, SLO)


def test_pareto_front_keeps_the_undominated():
    def trial(itl_ms, tok_s):
        return Trial(PdmuxConfig(), Measurement(itl_ms * 1e-3, 0.1, tok_s, 1.0))

    a, b, c, d = trial(10, 100), trial(12, 200), trial(11, 90), trial(12, 150)
    assert pareto_front([a, b, c, d]) == [a, b]
