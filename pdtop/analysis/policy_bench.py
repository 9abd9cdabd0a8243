"""The policy benchmark: long prompts arrive while a decode batch is running.

For each policy, on a fresh engine: `decode_bs` requests are prefilled and start
decoding; a decode-only baseline is measured (every unit to decode, no prefill);
then `long_prompts` long prompts arrive one after another, each when the previous
one has its first token. Reported: TTFT of the long prompts, the ITLs of the decode
requests while they arrive (pooled), the baseline ITL, and output tokens/s over
that window. Same seed, same prompts, same scenario for every policy.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from pdtop.analysis.metrics import percentile, summary_ms
from pdtop.engine.engine import Engine
from pdtop.engine.errors import EngineError
from pdtop.engine.request import Request


@dataclass
class Scenario:
    decode_bs: int
    decode_prompt: int
    long_tokens: int
    long_prompts: int = 3
    baseline_steps: int = 12
    settle_rounds: int = 3  # decode rounds after a long prompt's first token before the next arrives
    decode_tokens: int = 4096  # decode requests' max_tokens: enough to keep decoding through the run

    def kv_tokens(self, decode_budget: int, block_size: int = 16) -> int:
        """KV the scenario may hold at once: every request's promise (prompt + max_tokens), in blocks."""
        def blocks(tokens: int) -> int:
            return -(-tokens // block_size) * block_size
        decoding = self.decode_bs * blocks(self.decode_prompt + decode_budget)
        return decoding + self.long_prompts * blocks(self.long_tokens + 4)


SCENARIOS = {
    "sim": Scenario(decode_bs=32, decode_prompt=2048, long_tokens=8192),  # the seed's scenario
    "cpu": Scenario(decode_bs=8, decode_prompt=64, long_tokens=1024, baseline_steps=8, decode_tokens=1500),
    "cuda": Scenario(decode_bs=32, decode_prompt=2048, long_tokens=8192),
}


def _step_until_first_tokens(engine: Engine, reqs: list[Request]) -> list[float]:
    """Step until each request has its first token (EngineError if one is rejected); their TTFTs."""
    while any(not r.token_times for r in reqs):
        rejected = next((r for r in reqs if r.finished and not r.token_times), None)
        if rejected is not None:
            raise EngineError(f"the scenario's request {rejected.id} was rejected: {rejected.error}")
        engine.step()
    return [r.token_times[0] - r.arrival for r in reqs]


def run_policy(engine: Engine, sc: Scenario) -> dict:
    budget = min(engine.executor.cfg.max_context - sc.decode_prompt, sc.decode_tokens)
    need, capacity = sc.kv_tokens(budget, engine.executor.pool.block_size), engine.executor.kv_usage()[1]
    if need > capacity:  # it would wait for KV forever: say so before starting
        raise EngineError(f"the scenario needs {need:,} KV tokens ({sc.decode_bs} requests of {sc.decode_prompt}+"
                          f"{budget}, {sc.long_prompts} of {sc.long_tokens}); the cache holds {capacity:,}: raise "
                          "--kv-tokens or --gpu-memory-fraction, or lower --decode-bs")
    decoders = [engine.submit(engine.prompts.make(sc.decode_prompt), budget, ignore_eos=True)
                for _ in range(sc.decode_bs)]
    _step_until_first_tokens(engine, decoders)
    base = []
    for _ in range(sc.baseline_steps):
        rec = engine.step()
        if rec.decode_bs:
            base.append(rec.decode_step_s)
    start = engine.device.now()
    ttfts: list[float] = []
    longs: list[Request] = []
    for _ in range(sc.long_prompts):
        req = engine.submit(engine.prompts.make(sc.long_tokens), 4, ignore_eos=True)
        longs.append(req)
        ttfts += _step_until_first_tokens(engine, [req])
        for _ in range(sc.settle_rounds):
            engine.step()
    end = engine.device.now()
    if any(r.finished for r in decoders):
        raise EngineError("decode requests finished before the long prompts did; raise Scenario.decode_tokens")
    itls = [b - a for r in decoders for a, b in itertools.pairwise(r.token_times) if start < b <= end]
    tokens = sum(1 for r in decoders + longs for t in r.token_times if start < t <= end)
    return {
        "ttft_ms": {k: v for k, v in summary_ms(ttfts).items() if k != "max"},
        "itl_ms": summary_ms(itls),
        "itl_baseline_ms": percentile(base, 50) * 1e3,
        "output_tok_s": tokens / (end - start),
        "decode_units": engine.device.units,
    }


def run_bench(make_engine: Callable[[str], Engine], policies: list[str], sc: Scenario) -> dict[str, dict]:
    results = {}
    for policy in policies:
        engine = make_engine(policy)
        try:
            results[policy] = run_policy(engine, sc)
        finally:
            engine.close()
    return results
