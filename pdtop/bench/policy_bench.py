"""The policy benchmark: long prompts arrive while a decode batch is running.

For each policy, on a fresh engine: `decode_bs` requests are prefilled and start
decoding; then `long_prompts` long prompts arrive one after another. Each one opens a
*segment*: a plain decode round, the long prompt's arrival, rounds until its first
token, then `settle_rounds` rounds with it in the decode batch. Reported: TTFT of the
long prompts, the ITLs of the decode requests inside the segments (pooled), output
tokens/s over the segments, and interference (docs/levels.md, "Interference").

Interference compares like with like. After each segment, every decode step it ran is
replayed decode-only with the same requests at the same contexts, in turns: on the whole
device (`run_whole`; the baseline for that step's batch composition) and on the cores that
step's decode had, the prefill side idle (`run_decode` at its level). Each ITL divided by
the first is the interference; it factors into "fewer cores" (own cores / whole device,
decode-only) and "contention" (the ITL / own cores: what running beside the prefill cost).
The replays recompute each row's last token with the cache as it stands (rewriting that
token's K/V with the same values) and run between segments, seconds after the steps, so
they change neither the TTFTs nor the ITLs measured.
Same seed, same prompts, same scenario for every policy.
"""
from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pdtop.analysis.metrics import gaps_since, percentile, summary_ms
from pdtop.engine.devices.base import Work
from pdtop.engine.engine import Engine
from pdtop.engine.errors import EngineError, PromptError
from pdtop.engine.records import RoundRecord
from pdtop.engine.request import BlockTable, Request, RequestStatus
from pdtop.engine.runtime.heap import frozen_heap

Progress = Callable[[str], None]  # one message per stage: the decode batch running, then each long prompt
BASELINE_SPAN = 2  # a step's baseline: median replay of its composition's steps within +-2 (same requests)


@dataclass
class Scenario:
    decode_bs: int
    decode_prompt: int
    long_tokens: int
    long_prompts: int = 3
    settle_rounds: int = 3  # decode rounds after a long prompt's first token before the next arrives
    decode_tokens: int = 4096  # decode requests' max_tokens: enough to keep decoding through the run
    warmup_rounds: int = 8  # decode-only rounds before the first segment (not measured)
    # long prompts run before the measured ones (not measured): on a GPU the first use of each kernel in a
    # process compiles or loads it on the host, inside whichever round makes it (a server warms up the same)
    warmup_prompts: int = 0
    long_max_tokens: int = 4  # each long prompt decodes this many tokens (it joins the batch, then leaves)
    slo_itl_ms: float = 20.0  # goodput counts the tokens of requests whose ITL p99 (in the segments) meets this
    slo_ttft_ms: float = 1000.0  # and, for the long prompts, whose TTFT meets this

    def kv_tokens(self, decode_budget: int, block_size: int = 16) -> int:
        """KV the scenario may hold at once: every request's promise (prompt + max_tokens), in blocks."""
        def blocks(tokens: int) -> int:
            return -(-tokens // block_size) * block_size
        decoding = self.decode_bs * blocks(self.decode_prompt + decode_budget)
        return decoding + self.long_at_once * blocks(self.long_tokens + self.long_max_tokens)

    @property
    def long_at_once(self) -> int:
        """Long prompts holding KV at once: they run one after another (each ends with its segment's
        settle rounds), so at most one, counted twice for safety should a segment's end overlap the next."""
        return min(self.long_prompts, 2)


SCENARIOS = {
    "sim": Scenario(decode_bs=32, decode_prompt=2048, long_tokens=8192),  # the seed's scenario
    # 8 long prompts: TTFT p50 and max are figures of their own, not one prompt read twice
    "cpu": Scenario(decode_bs=8, decode_prompt=64, long_tokens=1024, long_prompts=8, decode_tokens=1500,
                    slo_itl_ms=250.0, slo_ttft_ms=5000.0),
    "cuda": Scenario(decode_bs=32, decode_prompt=2048, long_tokens=8192, warmup_prompts=1),
}
# `pdtop bench --quick`: about a minute for every policy on a 2-core cpu
QUICK = {"sim": dataclasses.replace(SCENARIOS["sim"], long_prompts=2),
         "cpu": dataclasses.replace(SCENARIOS["cpu"], decode_bs=4, long_tokens=512, long_prompts=2, decode_tokens=600),
         "cuda": dataclasses.replace(SCENARIOS["cuda"], long_prompts=2)}


@dataclass
class DecodeStep:
    """One round that ran a decode step inside a segment, and what its tokens cost."""
    segment: int
    record: RoundRecord
    rows: list[tuple[Request, int, list[int]]]  # request, its cached tokens before the step, its KV blocks
    gaps: list[float]  # ITL of each row's token (rows whose previous token is inside the segment)
    replay_s: float = float("nan")  # the same batch, decode-only on the whole device
    own_replay_s: float = float("nan")  # the same batch, decode-only on the cores this step's decode had
    baseline_s: float = float("nan")  # replay_s, smoothed (`replay_baselines`)
    own_baseline_s: float = float("nan")
    info: dict[str, Any] = field(default_factory=dict)  # what a RoundTracer saw (with --trace)

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(r.id for r, _, _ in self.rows)


class Observer:
    """Hooks around each measured round (`round_trace.RoundTracer` records what happened in it)."""

    def __init__(self, engine: Engine | None = None) -> None: ...

    def close(self) -> None: ...

    def before_round(self, engine: Engine) -> None: ...

    def after_round(self, engine: Engine, record: RoundRecord, decode_end: float | None = None) -> dict[str, Any]:
        """What happened in the round; `decode_end` is when its decode step ended (None if it ran none)."""
        return {}


def step_until_first_tokens(engine: Engine, reqs: list[Request]) -> list[float]:
    """Step until each request has its first token (EngineError if one is rejected); their TTFTs."""
    while any(not r.token_times for r in reqs):
        rejected = next((r for r in reqs if r.finished and not r.token_times), None)
        if rejected is not None:
            raise EngineError(f"the scenario's request {rejected.id} was rejected: {rejected.error}")
        engine.step()
    return [r.token_times[0] - r.arrival for r in reqs]


def _measured_round(engine: Engine, segment: int, start: float, observer: Observer) -> DecodeStep | None:
    """One round; the decode step it ran (None if it ran none) with the ITLs of its tokens."""
    running = list(engine.scheduler.running)  # the batch this round decodes, if it decodes
    before = [(r, r.num_cached, list(r.table.blocks)) for r in running]
    observer.before_round(engine)
    began = engine.device.now()
    record = engine.step()
    if not record.decode_bs:
        observer.after_round(engine, record)
        return None
    # A prefill that finished as the round began may join its decode batch (the cpu device's prefill side
    # runs on its own cores): its row held one token fewer before this step.
    known = {id(r) for r in running}
    joined = [r for r in engine.scheduler.running
              if id(r) not in known and len(r.token_times) >= 2 and r.token_times[-1] >= began]
    before += [(r, r.num_cached - 1, list(r.table.blocks)) for r in joined]
    running += joined
    info = observer.after_round(engine, record, running[0].token_times[-1])
    if record.decode_bs != len(running):
        raise EngineError(f"round {record.index} decoded {record.decode_bs} requests, {len(running)} were running")
    rows, gaps = [], []
    bs = engine.executor.pool.block_size
    for r, cached, blocks in before:
        if r.table.blocks:
            blocks = list(r.table.blocks)
        else:  # finished in this step: its blocks are released but hold its K/V until the next admission,
            blocks += blocks[-1:] * (-(-(cached + 1) // bs) - len(blocks))  # which comes after the replay
        rows.append((r, cached, blocks))
        gaps += gaps_since(r.token_times[-2:], start)  # this step's token, if its previous one is inside
    return DecodeStep(segment, record, rows, gaps, info=info)


def decode_only_itls(engine: Engine, rounds: int) -> list[float]:
    """ITLs (seconds) of the requests running now over the next `rounds` rounds, with nothing else
    to run: decode-only. Only gaps inside those rounds count (`gaps_since`), so whatever ran before
    (a policy run, its replayed baselines) does not reach the first gap of each request."""
    running = list(engine.scheduler.running)
    with frozen_heap():
        start = engine.device.now()
        for _ in range(rounds):
            engine.step()
    return [g for r in running for g in gaps_since(r.token_times, start)]


def _shadow(req: Request, cached: int, blocks: list[int]) -> Request:
    """`req` as it stood before a past decode step: `cached` tokens in its KV blocks, the next one to feed."""
    seq = req.prompt_ids + req.output_ids
    table = BlockTable(list(blocks), cached + 1, len(blocks))  # holds the step's slots: nothing to reserve
    return Request(req.id, seq[:cached], req.params, status=RequestStatus.DECODING, output_ids=[seq[cached]],
                   num_cached=cached, table=table)


def _timed(engine: Engine, run: Callable[[Work], Any], step: DecodeStep) -> float:
    work = engine.executor.decode_work([_shadow(*row) for row in step.rows])
    t0 = engine.device.now()
    run(work)
    return engine.device.now() - t0


def _smoothed(steps: list[DecodeStep], values: list[float]) -> list[float]:
    """Each step's median of `values` over the steps with the same requests within +-BASELINE_SPAN."""
    out, i = [], 0
    for _, group in itertools.groupby(steps, key=lambda s: s.key):
        n = len(list(group))
        mine = values[i:i + n]
        out += [statistics.median(mine[max(0, j - BASELINE_SPAN):j + BASELINE_SPAN + 1]) for j in range(n)]
        i += n
    return out


def replay_baselines(engine: Engine, steps: list[DecodeStep]) -> None:
    """Time each step's batch decode-only: on the whole device, and on the cores its decode had (the
    prefill side idle). Each step's baselines are medians over neighbours with the same requests."""
    dev = engine.device
    level = dev.level
    whole, own = [], []
    for s in steps:
        whole.append(_timed(engine, dev.run_whole, s))
        if 0 < s.record.decode_units < dev.units:  # decode had part of the device
            dev.set_level(s.record.level)
            own.append(_timed(engine, dev.run_decode, s))
        else:
            own.append(whole[-1])
    dev.set_level(level)
    for s, w, o, bw, bo in zip(steps, whole, own, _smoothed(steps, whole), _smoothed(steps, own), strict=True):
        s.replay_s, s.own_replay_s, s.baseline_s, s.own_baseline_s = w, o, bw, bo


@dataclass
class PolicyRun:
    summary: dict[str, Any]  # the figures (`summarize`)
    steps: list[DecodeStep]  # every measured decode step, for --trace


def _segment(engine: Engine, sc: Scenario, seg: int, obs: Observer) -> tuple[Request, list[DecodeStep], float]:
    """One long prompt's segment; (the long prompt, the decode steps, the segment's start)."""
    start = engine.device.now()
    steps: list[DecodeStep] = []

    def measured() -> None:
        step = _measured_round(engine, seg, start, obs)
        if step is not None:
            steps.append(step)

    measured()  # a plain decode round: the segment's first ITLs do not span the previous replay
    req = engine.submit(engine.prompts.make(sc.long_tokens), sc.long_max_tokens, ignore_eos=True)
    while not req.token_times:
        if req.finished:
            raise EngineError(f"the scenario's request {req.id} was rejected: {req.error}")
        measured()
    for _ in range(sc.settle_rounds):
        measured()
    return req, steps, start


def decode_max_tokens(engine: Engine, sc: Scenario) -> int:
    """The decode requests' max_tokens: the scenario's, within the model's context."""
    return min(engine.executor.cfg.max_context - sc.decode_prompt, sc.decode_tokens)


def check_fits(engine: Engine, sc: Scenario) -> None:
    """PromptError (one line) when the scenario's prompts do not fit the model's context or its requests
    the KV cache, before any request is sent (`pdtop bench` and `pdtop tune` alike): a long prompt past
    the context would be rejected mid-run, and requests the cache cannot hold would wait for KV forever."""
    cfg, pool = engine.executor.cfg, engine.executor.pool
    for what, tokens in (("decode prompt", sc.decode_prompt + 1), ("long prompt", sc.long_tokens + sc.long_max_tokens)):
        if tokens > cfg.max_context:
            raise PromptError(f"the workload's {what} ({tokens} tokens with its output) is longer than the model's "
                              f"context ({cfg.max_context} tokens)")
    # the long prompts come one after another, each done a few rounds after its first token: count those
    # held at once (`Scenario.long_at_once`), not all of them
    budget = decode_max_tokens(engine, sc)
    need = sc.kv_tokens(budget, pool.block_size)
    if need > pool.capacity_tokens:
        raise PromptError(f"the workload does not fit the KV cache: the scenario needs {need:,} KV tokens "
                          f"({sc.decode_bs} decode requests of {sc.decode_prompt}+{budget}, {sc.long_at_once} long "
                          f"prompts at once of {sc.long_tokens}+{sc.long_max_tokens}); the cache holds "
                          f"{pool.capacity_tokens:,}: raise --kv-tokens or --gpu-memory-fraction, or lower --decode-bs")


def run_policy(engine: Engine, sc: Scenario, progress: Progress | None = None,
               observer: Observer | None = None) -> PolicyRun:
    with frozen_heap():  # as `pdtop serve` runs its rounds
        return _run_policy(engine, sc, progress, observer)


def _run_policy(engine: Engine, sc: Scenario, progress: Progress | None, observer: Observer | None) -> PolicyRun:
    say = progress or (lambda _: None)
    obs = observer or Observer()
    check_fits(engine, sc)
    budget = decode_max_tokens(engine, sc)
    decoders = [engine.submit(engine.prompts.make(sc.decode_prompt), budget, ignore_eos=True)
                for _ in range(sc.decode_bs)]
    step_until_first_tokens(engine, decoders)
    for _ in range(sc.warmup_rounds):
        engine.step()
    warm_itls = [g for _ in range(sc.warmup_prompts) for s in _segment(engine, sc, -1, obs)[1] for g in s.gaps]
    say(f"decoding: {len(decoders)} requests running")
    ttfts: list[float] = []
    steps: list[DecodeStep] = []
    longs: list[Request] = []
    windows: list[tuple[float, float]] = []
    for seg in range(sc.long_prompts):
        req, seg_steps, start = _segment(engine, sc, seg, obs)
        windows.append((start, engine.device.now()))
        longs.append(req)
        ttfts.append(req.token_times[0] - req.arrival)
        replay_baselines(engine, seg_steps)
        steps += seg_steps
        say(f"long prompt {seg + 1}/{sc.long_prompts}: TTFT {ttfts[-1]:.2f} s, {len(seg_steps)} decode steps, "
            f"interference p50 {_ratios(seg_steps, 'gap', 'baseline_s')['p50']:.2f}x")
    if any(r.finished for r in decoders):
        raise EngineError("decode requests finished before the long prompts did; raise Scenario.decode_tokens")
    devices = 2 if engine.scheduler.policy == "disagg" else 1
    out = summarize(steps, ttfts, decoders + longs, windows, engine.device.units)
    good = goodput_tok_s(decoders, longs, windows, sc)
    out.update({"devices": devices, "goodput_tok_s": good, "goodput_tok_s_per_device": good / devices,
                "output_tok_s_per_device": out["output_tok_s"] / devices})
    if sc.warmup_prompts:
        out["warmup_itl_ms"] = {**summary_ms(warm_itls, (50,)), "prompts": sc.warmup_prompts}
    return PolicyRun(out, steps)


def goodput_tok_s(decoders: list[Request], longs: list[Request], windows: list[tuple[float, float]],
                  sc: Scenario) -> float:
    """Output tokens/s over the segments of the requests that met the SLOs: a request's ITL p99 over
    its gaps inside the segments at most `slo_itl_ms`, and a long prompt's TTFT at most `slo_ttft_ms`."""
    good = 0
    for r in decoders + longs:
        inside = [[t for t in r.token_times if a < t <= b] for a, b in windows]
        gaps = [y - x for ts in inside for x, y in itertools.pairwise(ts)]
        ok = not gaps or percentile(gaps, 99) <= sc.slo_itl_ms / 1e3
        if r in longs:
            ok = ok and r.ttft is not None and r.ttft <= sc.slo_ttft_ms / 1e3
        good += sum(map(len, inside)) if ok else 0
    busy = sum(b - a for a, b in windows)
    return good / busy if busy else float("nan")


def _ratios(steps: list[DecodeStep], num: str, den: str) -> dict[str, float]:
    """p50/p99/max over tokens of `num / den`, each a DecodeStep attribute ("gap": each token's ITL)."""
    xs = [(g if num == "gap" else getattr(s, num)) / getattr(s, den) for s in steps for g in s.gaps]
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "max": max(xs, default=float("nan")), "n": len(xs)}


def summarize(steps: list[DecodeStep], ttfts: list[float], reqs: list[Request], windows: list[tuple[float, float]],
              units: int) -> dict[str, Any]:
    itls = [g for s in steps for g in s.gaps]
    baselines = [s.baseline_s for s in steps for _ in s.gaps]
    tokens = sum(1 for r in reqs for t in r.token_times if any(a < t <= b for a, b in windows))
    busy = sum(b - a for a, b in windows)
    return {
        "ttft_ms": {**summary_ms(ttfts, (50,)), "n": len(ttfts)},
        "itl_ms": summary_ms(itls),
        "baseline_ms": summary_ms(baselines, (50,)),
        "interference": _ratios(steps, "gap", "baseline_s"),  # each ITL / decode-only on the whole device
        "fewer_cores": _ratios(steps, "own_baseline_s", "baseline_s"),  # decode-only: own cores / whole device
        "contention": _ratios(steps, "gap", "own_baseline_s"),  # each ITL / decode-only on its own cores
        "decode_steps": len(steps),
        "output_tok_s": tokens / busy if busy else float("nan"),
        "decode_units": units,
    }


def trace_rows(policy: str, steps: list[DecodeStep]) -> list[dict[str, Any]]:
    """One JSON-ready row per measured decode step (`pdtop bench --trace`)."""
    rows = []
    for s in steps:
        rec = asdict(s.record)
        rec.pop("prefills")
        ctx = [cached + 1 for _, cached, _ in s.rows]
        gap = statistics.median(s.gaps) if s.gaps else float("nan")
        rows.append({"policy": policy, "segment": s.segment, **rec, "contexts": [min(ctx), max(ctx), sum(ctx)],
                     "gap_s": gap, "replay_s": s.replay_s, "baseline_s": s.baseline_s,
                     "own_replay_s": s.own_replay_s, "own_baseline_s": s.own_baseline_s,
                     "ratio": gap / s.baseline_s, **s.info})
    return rows


def run_bench(make_engine: Callable[[str], Engine], policies: list[str], sc: Scenario,
              progress: Progress | None = None,
              observer: Callable[[Engine], Observer] = Observer,
              results: dict[str, PolicyRun] | None = None) -> dict[str, PolicyRun]:
    """Each policy on a fresh engine from `make_engine`, watched by `observer(engine)`. Each finished
    policy's run goes into `results` (when given) as it ends, so an interrupted caller keeps them."""
    results = {} if results is None else results
    for policy in policies:
        engine = make_engine(policy)
        obs = observer(engine)
        try:
            say = (lambda msg, p=policy: progress(f"{p}: {msg}")) if progress else None
            results[policy] = run_policy(engine, sc, say, obs)
        finally:
            obs.close()
            engine.close()
    return results
