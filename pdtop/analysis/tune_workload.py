"""`pdtop tune` on an engine: each candidate runs `pdtop bench`'s seeded scenario, and the search
space is SGLang's knobs for the engine's device.

A candidate's run, on a fresh engine: under the prefill-first policy (which no pdmux knob
changes), `decode_bs` requests are prefilled and decode a few rounds on the whole device (the
decode-only ITL); then pdmux and the candidate are set through the engine's validated control
path (a `set` message, as a live override would be), and `long_prompts` long prompts arrive one
after another, each when the previous one has its first token and `settle_rounds` more rounds
have run. The window runs from the first long prompt's arrival to the end; every request in it
is scored (`tune.score`).

The warm-up is the same for every candidate, so two configurations that pick the same split
for every decode batch size of the window (`decode_bs` .. `decode_bs + long_prompts`) and run the
same layers per round for a long prompt behave the same: the space's key says so, and the
search measures one of them.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdtop.analysis.metrics import percentile
from pdtop.analysis.policy_bench import Scenario
from pdtop.analysis.tune import (
    Axis,
    Family,
    Measurement,
    ParetoSearch,
    RequestSample,
    SearchRun,
    SearchSpace,
    Slo,
    Trial,
    closest_trials,
    covered_s,
    run_search,
    score,
)
from pdtop.engine.engine import Engine
from pdtop.engine.errors import EngineError, FieldError, PromptError
from pdtop.engine.request import Request
from pdtop.engine.roofline.partition import arch_constraints
from pdtop.engine.scheduling.commands import Set
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable, prefill_layers_per_step, slice_layers

LONG_MAX_TOKENS = 4  # each long prompt decodes this many tokens, then leaves
WARMUP_ROUNDS = 8  # decode-only rounds before the candidate is applied
SGLANG_DEFAULT = PdmuxConfig(sm_group_num=8, manual_divisions=[], split_forward_token_budget=65536,
                             decode_bs_divisor=36)  # SGLang's PDMuxConfig defaults
WORKLOAD_KEYS = ("decode_bs", "decode_prompt", "long_tokens", "long_prompts", "settle_rounds", "decode_tokens")


def parse_workload(text: str, base: Scenario) -> Scenario:
    """`decode_bs=64,long_tokens=16384` (or a YAML file of those keys) over `base`; FieldError if malformed."""
    if "=" not in text and os.path.isfile(text):
        import yaml

        with open(text, encoding="utf-8") as f:
            try:
                raw = yaml.safe_load(f) or {}
            except yaml.YAMLError:
                raise FieldError(text, "not valid YAML", "workload ") from None
        if not isinstance(raw, dict):
            raise FieldError(text, "must be a mapping of " + ", ".join(WORKLOAD_KEYS), "workload ")
        items = [(str(k), v) for k, v in raw.items()]
    else:
        items = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise FieldError(part, f"expected KEY=VALUE with KEY one of {', '.join(WORKLOAD_KEYS)}", "workload ")
            items.append((key.strip(), value.strip()))
    values: dict[str, int] = {}
    for key, value in items:
        if key not in WORKLOAD_KEYS:
            raise FieldError(key, f"unknown; known: {', '.join(WORKLOAD_KEYS)}", "workload ")
        try:
            number = int(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        low = 0 if key == "settle_rounds" else 1
        if number is None or number < low:
            raise FieldError(key, f"must be an integer >= {low}, got {value!r}", "workload ")
        values[key] = number
    return dataclasses.replace(base, **values)


def decode_max_tokens(engine: Engine, sc: Scenario) -> int:
    return min(engine.executor.cfg.max_context - sc.decode_prompt, sc.decode_tokens)


def check_fits(engine: Engine, sc: Scenario) -> None:
    """PromptError (one line) when the scenario's prompts do not fit the context or its requests the KV cache."""
    cfg, pool = engine.executor.cfg, engine.executor.pool
    for what, tokens in (("decode prompt", sc.decode_prompt + 1), ("long prompt", sc.long_tokens + LONG_MAX_TOKENS)):
        if tokens > cfg.max_context:
            raise PromptError(f"the workload's {what} ({tokens} tokens with its output) is longer than the model's "
                              f"context ({cfg.max_context} tokens)")
    # the long prompts come one after another, each done a few rounds after its first token: as
    # `pdtop bench`, count those held at once (`Scenario.long_at_once`), not all of them
    need = (sc.decode_bs * pool.blocks_for(sc.decode_prompt + decode_max_tokens(engine, sc))
            + sc.long_at_once * pool.blocks_for(sc.long_tokens + LONG_MAX_TOKENS))
    if need > pool.num_blocks:
        raise PromptError(f"the workload does not fit the KV cache: {sc.decode_bs} decode requests and "
                          f"{sc.long_at_once} long prompts at once need {need * pool.block_size} tokens, the cache "
                          f"holds {pool.capacity_tokens}")


def _step_until_first_token(engine: Engine, reqs: list[Request]) -> None:
    while any(not r.token_times for r in reqs):
        rejected = next((r for r in reqs if r.finished and not r.token_times), None)
        if rejected is not None:
            raise EngineError(f"the workload's request {rejected.id} was rejected: {rejected.error}")
        engine.step()


def changes_to(engine: Engine, config: PdmuxConfig) -> dict[str, Any]:
    """The `Set` values that take the engine from its configuration to `config`."""
    now = engine.config.to_dict()
    return {k: v for k, v in config.for_device(engine.device.kind).to_dict().items() if now[k] != v}


def device_default(kind: str) -> PdmuxConfig:
    """SGLang's default knobs with the device's own budget where pdtop has one (4,096 on cpu): the
    configuration `pdtop` runs on that device without a file, and what is written if it is chosen."""
    return SGLANG_DEFAULT.replace(split_forward_token_budget=PdmuxConfig().for_device(kind).token_budget)


def measure(engine: Engine, sc: Scenario, slo: Slo, config: PdmuxConfig, deadline: float | None = None,
            policy: str = "pdmux") -> Measurement:
    """Run the scenario on a fresh `engine` with `config` and `policy` applied after the warm-up (see the
    module doc). Past `deadline` (time.monotonic) no further long prompt is sent: the window ends with
    those measured."""
    engine.control(Set({"policy": "prefill-first"}))
    decoders = [engine.submit(engine.prompts.make(sc.decode_prompt), decode_max_tokens(engine, sc), ignore_eos=True)
                for _ in range(sc.decode_bs)]
    _step_until_first_token(engine, decoders)
    steps = [rec.decode_step_s for rec in (engine.step() for _ in range(WARMUP_ROUNDS)) if rec.decode_bs]
    applied = engine.control(Set({"policy": policy, **changes_to(engine, config)}))
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
        longs.append(engine.submit(engine.prompts.make(sc.long_tokens), LONG_MAX_TOKENS, ignore_eos=True))
        _step_until_first_token(engine, longs[-1:])
        for _ in range(sc.settle_rounds):
            engine.step()
    end = engine.device.now()
    if any(r.finished for r in decoders):
        raise EngineError("the decode requests finished before the long prompts did; raise the workload's "
                          "decode_tokens")
    samples = [RequestSample(r.ttft if r.arrival >= start else None,
                             [b - a for a, b in itertools.pairwise(r.token_times) if start < b <= end])
               for r in decoders + longs]
    waits = [(r.arrival, r.token_times[0]) for r in longs]
    return score(samples, slo, end - start, sum(r.prompt_len for r in longs), covered_s(waits),
                 percentile(steps, 50))


def pdmux_space(table: SplitTable, sc: Scenario, num_layers: int) -> SearchSpace:
    """SGLang's knobs on the device of `table`, and the key that says when two behave the same.

    - auto: `sm_group_num` (3 .. every split level the device's rule has), `decode_bs_divisor` (the
      values where the level chosen for the window's decode batch sizes changes, and 36);
    - manual: one division `[prefill, decode, 1]` (used whenever both sides run), prefill units in
      steps of the device's granularity;
    - overlap: the same division with `overlap_decode_full_sm` (decode on the whole device beside it);
    - all: `split_forward_token_budget` as layers per round for a long prompt (1 .. all layers), and
      `max_split_forward_layers` (0: off, 1, 2, 4). The long prompts arrive while decode runs, so a
      cap below the budget's layers behaves as that smaller budget would: the key says so.
    """
    bs_range = range(sc.decode_bs, sc.decode_bs + sc.long_prompts + 1)
    total, budgets = table.units, Axis("layers_per_round", tuple(range(1, num_layers + 1)))
    caps = Axis("max_split_forward_layers", (0, 1, 2, 4))
    most = len(table.rebuilt(PdmuxConfig(sm_group_num=256)).groups)
    divisors = {36} | {max(1, bs * m // level + e) for m in range(1, most - 1) for bs in bs_range
                       for level in range(1, m + 1) for e in (0, 1)}
    min_part, step = arch_constraints(table.cc_major) if table.cc_major is not None else (1, 1)

    def sliced(config: PdmuxConfig, v: dict[str, int]) -> PdmuxConfig:
        return config.replace(split_forward_token_budget=v["layers_per_round"] * sc.long_tokens,
                              max_split_forward_layers=v["max_split_forward_layers"])

    def auto(v: dict[str, int]) -> PdmuxConfig:
        return sliced(PdmuxConfig(sm_group_num=v["sm_group_num"], decode_bs_divisor=v["decode_bs_divisor"]), v)

    def manual(v: dict[str, int], overlap: bool = False) -> PdmuxConfig:
        p = v["prefill_units"]
        return sliced(PdmuxConfig(sm_group_num=3, manual_divisions=[[p, total - p, 1]],
                                  overlap_decode_full_sm=overlap), v)

    def key(config: PdmuxConfig) -> tuple[Any, ...]:
        t = table.rebuilt(config)  # ConfigError when a manual split does not fit the device
        splits = tuple(t.groups[t.choose(bs, True, config)] for bs in bs_range)
        layers = prefill_layers_per_step(sc.long_tokens, num_layers, config.token_budget)
        return splits, slice_layers(layers, config.max_split_forward_layers, True)

    prefill = Axis("prefill_units", tuple(range(min_part, total - min_part + 1, step)))
    return SearchSpace((
        Family("auto", (Axis("sm_group_num", tuple(range(3, most + 1))),
                        Axis("decode_bs_divisor", tuple(sorted(divisors))), budgets, caps), auto),
        Family("manual", (prefill, budgets, caps), manual),
        Family("overlap", (prefill, budgets, caps), lambda v: manual(v, overlap=True)),
    ), key)


@dataclass
class TuneReport:
    slo: Slo
    scenario: Scenario
    default: Trial  # SGLang's default configuration on the same workload
    trials: list[Trial]  # every behaviour measured
    front: list[Trial]
    best: Trial | None  # best goodput among those that meet the SLOs
    closest: list[Trial]  # nearest to the SLOs (when none meets them)
    run: SearchRun
    grid_size: int


def tune(make_engine: Callable[[], Engine], sc: Scenario, slo: Slo, budget_s: float = math.inf,
         progress: Callable[[Trial, float], None] | None = None, coarse: int = 3) -> TuneReport:
    """Search the engine's space on the scenario; `make_engine()` builds a fresh engine with the
    default configuration (each candidate gets its own)."""
    t0 = time.monotonic()
    engine = make_engine()
    kind = engine.device.kind
    try:
        check_fits(engine, sc)
        space = pdmux_space(engine.scheduler.table, sc, engine.executor.cfg.num_layers)
    finally:
        engine.close()

    def evaluate(config: PdmuxConfig, deadline: float | None = None) -> Measurement:
        e = make_engine()
        try:
            return measure(e, sc, slo, config, deadline)
        finally:
            e.close()

    reference = device_default(kind)
    search = ParetoSearch(space, slo, coarse, reference=reference)
    started = time.monotonic()  # the default is always measured, cut short at the budget's end
    default = search.tell(reference, evaluate(reference, t0 + budget_s))
    if progress is not None:
        progress(default, time.monotonic() - t0)
    run = run_search(search, evaluate, budget_s - (time.monotonic() - t0), progress,
                     longest_s=time.monotonic() - started)
    run = dataclasses.replace(run, measured=run.measured + 1, elapsed_s=time.monotonic() - t0)
    trials = list(search.trials.values())
    best = search.best
    return TuneReport(slo, sc, default, trials, search.front, best,
                      [] if best is not None else closest_trials(trials, slo), run, space.size)
