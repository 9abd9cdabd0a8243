"""`pdtop tune` on pdtop's own engine: each candidate runs `pdtop bench`'s seeded scenario on a fresh
engine, the search space is SGLang's knobs for the engine's device (`space.pdmux_space`), and the
search is `search.run_search` with an `EngineRunner`.

A candidate's run: under the prefill-first policy (which no pdmux knob changes), `decode_bs`
requests are prefilled and decode a few rounds on the whole device (the decode-only ITL); then
pdmux and the candidate are set through the engine's validated control path (a `set` message, as
a live override would be), and `long_prompts` long prompts arrive one after another, each when the
previous one has its first token and `settle_rounds` more rounds have run. The window runs from the
first long prompt's arrival to the end; every request in it is scored (`score.score`).

The warm-up is the same for every candidate, so two configurations that pick the same split
for every decode batch size of the window (`decode_bs` .. `decode_bs + long_prompts`) and run the
same layers per round for a long prompt behave the same: the space's key says so, and the
search measures one of them.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdtop.analysis.metrics import percentile
from pdtop.bench.policy_bench import Scenario, check_fits, decode_max_tokens, step_until_first_tokens
from pdtop.engine.engine import Engine
from pdtop.engine.errors import EngineError, FieldError
from pdtop.engine.request import Request
from pdtop.engine.runtime.heap import frozen_heap
from pdtop.engine.scheduling.commands import Set
from pdtop.engine.scheduling.pdmux_config import SGLANG_RELEASE, PdmuxConfig
from pdtop.tune.report import TuneReport
from pdtop.tune.score import Measurement, RequestSample, Slo, covered_s, score
from pdtop.tune.search import AdaptiveSearch, Trial, closest_trials, run_search
from pdtop.tune.space import device_default, first_guess, pdmux_space

WARMUP_ROUNDS = 8  # decode-only rounds before the candidate is applied
UNMEASURED = Measurement(math.nan, math.nan, math.nan, math.nan)


class DecodeRanOut(EngineError):
    """The decode requests finished before the long prompts did: the window cannot be measured."""


def changes_to(engine: Engine, config: PdmuxConfig) -> dict[str, Any]:
    """The `Set` values that take the engine from its configuration to `config`."""
    now = engine.config.to_dict()
    return {k: v for k, v in config.for_device(engine.device.kind).to_dict().items() if now[k] != v}


def measure(engine: Engine, sc: Scenario, slo: Slo, config: PdmuxConfig, deadline: float | None = None,
            policy: str = "pdmux") -> Measurement:
    """Run the scenario on a fresh `engine` with `config` and `policy` applied after the warm-up (see the
    module doc). Past `deadline` (time.monotonic) no further long prompt is sent: the window ends with
    those measured. The heap is frozen meanwhile, as `pdtop serve` runs its rounds."""
    with frozen_heap():
        return _measure(engine, sc, slo, config, deadline, policy)


def _measure(engine: Engine, sc: Scenario, slo: Slo, config: PdmuxConfig, deadline: float | None,
             policy: str) -> Measurement:
    engine.control(Set(policy="prefill-first"))
    decoders = [engine.submit(engine.prompts.make(sc.decode_prompt), decode_max_tokens(engine, sc), ignore_eos=True)
                for _ in range(sc.decode_bs)]
    step_until_first_tokens(engine, decoders)
    steps = [rec.decode_step_s for rec in (engine.step() for _ in range(WARMUP_ROUNDS)) if rec.decode_bs]
    applied = engine.control(Set(policy=policy, **changes_to(engine, config)))
    engine.step()  # applied at this round's start
    if applied.done():
        applied.result()  # ControlError (an EngineError) naming what the engine refused
    if changes_to(engine, config) or engine.scheduler.policy != policy:
        raise EngineError(f"the engine did not take the candidate {config}")
    start = engine.device.now()
    longs: list[Request] = []
    for _ in range(sc.long_prompts):
        if longs and deadline is not None and time.monotonic() > deadline:
            break
        longs.append(engine.submit(engine.prompts.make(sc.long_tokens), sc.long_max_tokens, ignore_eos=True))
        step_until_first_tokens(engine, longs[-1:])
        for _ in range(sc.settle_rounds):
            engine.step()
    end = engine.device.now()
    if any(r.finished for r in decoders):
        raise DecodeRanOut("the decode requests finished before the long prompts did; raise the workload's "
                           "decode_tokens")
    samples = [RequestSample(r.ttft if r.arrival >= start else None,
                             [b - a for a, b in itertools.pairwise(r.token_times) if start < b <= end])
               for r in decoders + longs]
    waits = [(r.arrival, r.token_times[0]) for r in longs]
    return score(samples, slo, end - start, sum(r.prompt_len for r in longs), covered_s(waits),
                 percentile(steps, 50))


def decode_only_itl_s(engine: Engine, sc: Scenario) -> float:
    """The scenario's decode requests alone on the whole device: the median step of the warm-up's rounds
    (what `measure` reports as `decode_only_itl_s`), on a fresh engine it leaves busy."""
    engine.control(Set(policy="prefill-first"))
    decoders = [engine.submit(engine.prompts.make(sc.decode_prompt), decode_max_tokens(engine, sc), ignore_eos=True)
                for _ in range(sc.decode_bs)]
    step_until_first_tokens(engine, decoders)
    return percentile([rec.decode_step_s for rec in (engine.step() for _ in range(WARMUP_ROUNDS)) if rec.decode_bs], 50)


def check_reachable(decode_only_s: float, slo: Slo, device: str) -> None:
    """FieldError (one line) when the ITL SLO is below what decode alone achieves: no split can meet it."""
    if slo.itl_s < decode_only_s:
        raise FieldError("--slo-itl-ms", f"{slo.itl_s * 1e3:g} ms is below what decode alone achieves on {device} "
                         f"for this workload ({decode_only_s * 1e3:.2f} ms a step with every unit decoding and nothing "
                         "else): no configuration can meet it", "")


@dataclass
class EngineRunner:
    """Each candidate on a fresh engine; the budget kept by not starting one that the longest so far says
    would not end before `deadline`."""

    make_engine: Callable[[], Engine]
    sc: Scenario
    slo: Slo
    deadline: float  # time.monotonic()
    deterministic: bool
    launches: int = 0
    runs: int = 0
    longest_s: float = 0.0

    def live(self) -> PdmuxConfig | None:
        return None

    def fits(self, live: bool) -> bool:
        return time.monotonic() + self.longest_s <= self.deadline

    def measure(self, config: PdmuxConfig, repeat: int) -> Measurement:
        """`config`'s figures on a fresh engine; a candidate so slow that the decode requests ran out before
        its long prompts did is unmeasured (it misses every SLO), SGLang's default so slow is an error (the
        workload's decode_tokens are too few)."""
        engine = self.make_engine()
        start = time.monotonic()
        try:
            return measure(engine, self.sc, self.slo, config, self.deadline)
        except DecodeRanOut:
            if self.runs == 0:  # the first candidate: SGLang's default
                raise
            return UNMEASURED
        finally:
            engine.close()
            self.runs += 1
            self.longest_s = max(self.longest_s, time.monotonic() - start)


def tune(make_engine: Callable[[], Engine], sc: Scenario, slo: Slo, budget_s: float = math.inf,
         progress: Callable[[Trial, Measurement], None] | None = None, sglang: str = SGLANG_RELEASE,
         seed: int = 0) -> TuneReport:
    """Search the engine's space on the scenario for SGLang `sglang`; `make_engine()` builds a fresh engine
    with the default configuration (each candidate gets its own). FieldError at once when the ITL SLO is
    below the decode-only ITL."""
    t0 = time.monotonic()
    engine = make_engine()
    kind = engine.device.kind
    try:
        check_fits(engine, sc)
        space = pdmux_space(engine.scheduler.table, sc, engine.executor.cfg.num_layers, sglang)
        check_reachable(decode_only_itl_s(engine, sc), slo, engine.device.name)
        spec = getattr(engine.device, "spec", None)
        guess = first_guess(space, spec, engine.executor.cfg, sc, slo) if spec is not None else None
    finally:
        engine.close()
    search = AdaptiveSearch(space, slo, seed)
    runner = EngineRunner(make_engine, sc, slo, t0 + budget_s, kind == "sim")
    run = run_search(search, runner, device_default(kind), guess, progress)
    run = dataclasses.replace(run, elapsed_s=time.monotonic() - t0)
    trials = sorted(search.trials.values(), key=lambda t: t.order)
    best = search.best
    default = search.measured(device_default(kind))
    assert default is not None
    return TuneReport(slo, sc, default, trials, search.front, best,
                      [] if best is not None else closest_trials(trials, slo), run, space)
