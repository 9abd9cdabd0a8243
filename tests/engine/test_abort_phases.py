"""An abort at every phase of a request, under every policy, on the CPU (real model) and a simulated GPU.

Issue 38 item 1: a client that closed its socket while its prompt was being prefilled on the CPU
stopped the engine ("its prefill is in flight; finish it before freeing"). Here a request is
aborted after each number of rounds from 0 (still queued) to past its end: through every prefill
slice, the last layer, the first decode steps and, under disagg, the KV transfer. Each time the
engine goes on, the request ends "abort" (or finished on its own first), its KV comes back, no
prefill stays in flight in the runner, and the next request still runs to its end.
"""
from __future__ import annotations

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.records import RequestRecord
from pdtop.engine.request import SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

POLICIES = ["pdmux", "chunked", "prefill-first", "disagg"]


def _in_flight(engine) -> int:
    """Prefill states the runners still hold (0 on the simulator, which keeps none)."""
    executors = [engine.executor]
    disagg = engine.scheduler.made.get("disagg")
    if disagg is not None:
        executors.append(disagg.prefill)
    return sum(len(ex._in_flight) for ex in executors if isinstance(ex, ModelRunner))


def _abort_at_every_round(engine, prompt: int, beside_decode: bool, max_rounds: int = 400) -> int:
    """Abort a lone prompt after 0, 1, 2, ... rounds until it has finished on its own before the
    abort; `beside_decode`: while another request decodes (its prefill sliced between decode steps),
    else alone on the device. The number of rounds it took to finish."""
    records: list = []
    engine.add_sink(records.append)
    vocab = engine.executor.cfg.vocab
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for k in range(max_rounds):
        keep = engine.enqueue([7] * 32, SamplingParams(max_tokens=k + 8 if beside_decode else 1,
                                                       ignore_eos=True))
        while not keep.output_ids:  # decoding (or done) before the prompt arrives: the prompt prefills alone
            engine.step()
        req = engine.enqueue([(11 * i) % vocab for i in range(prompt)], params)
        for _ in range(k):
            engine.step()
        done = req.finished
        engine.abort(req)
        engine.run_until_idle(max_rounds=10_000)
        assert req.finished and keep.finished, f"round {k}"
        assert req.finish_reason == ("length" if done else "abort"), f"round {k}: {req.finish_reason}"
        assert engine.executor.kv_usage()[0] == 0, f"round {k}: KV still held"
        assert _in_flight(engine) == 0, f"round {k}: a prefill left in flight"
        finishes = [r for r in records
                    if isinstance(r, RequestRecord) and r.kind == "finish" and r.request_id == req.id]
        assert len(finishes) == 1, f"round {k}: {len(finishes)} finish records"
        if done:
            break
    else:
        pytest.fail(f"the prompt did not finish in {max_rounds} rounds")
    after = engine.enqueue([5] * prompt, params)  # the engine still runs requests to their end
    engine.run_until_idle(max_rounds=10_000)
    assert after.finish_reason == "length" and len(after.output_ids) == 4
    return k


@pytest.mark.parametrize("beside_decode", [False, True], ids=["alone", "beside-decode"])
@pytest.mark.parametrize("policy", POLICIES)
def test_an_abort_at_any_round_never_stops_the_cpu_engine(policy, beside_decode, model_fp32):
    # a 300-token prompt prefills in slices of 4096 // 300 = 13 layers: three slices of 30 layers
    config = PdmuxConfig(split_forward_token_budget=4096, chunk_size=128)
    engine = build_engine("cpu", loaded_model=model_fp32, policy=policy, config=config, kv_capacity_tokens=4096)
    try:
        rounds = _abort_at_every_round(engine, prompt=300, beside_decode=beside_decode)
    finally:
        engine.close()
    assert rounds >= 2  # queued, then each round it ran, until it finished


@pytest.mark.parametrize("beside_decode", [False, True], ids=["alone", "beside-decode"])
@pytest.mark.parametrize("policy", POLICIES)
def test_an_abort_at_any_round_on_a_simulated_gpu(policy, beside_decode):
    config = PdmuxConfig(split_forward_token_budget=16384, chunk_size=2048)
    engine = build_engine("sim:H100", policy=policy, config=config)
    try:
        rounds = _abort_at_every_round(engine, prompt=8192, beside_decode=beside_decode)
    finally:
        engine.close()
    assert rounds >= 2
