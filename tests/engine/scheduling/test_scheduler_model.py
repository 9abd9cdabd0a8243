"""The scheduler with the real model on the CPU device: policies change timing, never tokens."""
from __future__ import annotations

from pdtop.engine.build import build_engine
from pdtop.engine.records import RoundRecord
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import prefill_layers_per_step

PROMPTS = [
    ("What is the capital of France?", 12),
    ("Name three colours of the rainbow.", 16),
    ("Write one sentence about rivers.", 10),
]


def _run(model, tokenizer, policy: str, config: PdmuxConfig) -> tuple[list[list[int]], list[RoundRecord]]:
    engine = build_engine("cpu", policy=policy, config=config, loaded_model=model)
    rounds: list[RoundRecord] = []
    engine.add_sink(lambda r: rounds.append(r) if isinstance(r, RoundRecord) else None)
    try:
        reqs = []
        for text, n in PROMPTS:
            ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
            reqs.append(engine.submit(ids, n))
            engine.step()  # later requests arrive while earlier ones decode
        long = engine.submit(engine.prompts.make(700), 6, ignore_eos=True)
        reqs.append(long)
        engine.run_until_idle(max_rounds=500)
        assert all(r.finished for r in reqs)
        return [r.output_ids for r in reqs], rounds
    finally:
        engine.close()


def test_same_greedy_tokens_under_every_policy(model_fp32, tokenizer):
    # small budget and chunks so pdmux really splits by layer and chunked really chunks
    config = PdmuxConfig(split_forward_token_budget=2048, chunk_size=256)
    outs = {p: _run(model_fp32, tokenizer, p, config) for p in ("pdmux", "chunked", "prefill-first")}
    tokens = {p: o[0] for p, o in outs.items()}
    assert tokens["pdmux"] == tokens["chunked"] == tokens["prefill-first"]
    assert tokenizer.decode(tokens["pdmux"][0]).startswith("The capital of France is Paris.")
    long_id = len(PROMPTS)
    # the batch holding the 700-token prompt advanced 2048 // tokens layers per round, alongside decode
    split = [r for r in outs["pdmux"][1] if r.prefills and long_id in r.prefills[0].request_ids]
    assert split
    tokens = split[0].prefills[0].tokens
    assert tokens >= 700
    assert {r.prefills[0].layers_per_round for r in split} == {prefill_layers_per_step(tokens, 30, 2048)}
    assert any(r.decode_bs > 0 and 0 < r.prefills[0].layers_done < 30 for r in split)
    assert any(r.prefill_units and r.decode_units for r in split)  # both sides had cores
    chunked = [r for r in outs["chunked"][1] if r.prefills and long_id in r.prefills[0].request_ids]
    # 700 tokens in 256-token chunks: 3 steps, in progress at the end of the first two, mixed with decode
    assert len(chunked) == 2 and all(r.decode_bs > 0 for r in chunked)


def test_bad_request_is_rejected_and_engine_goes_on(model_fp32, tokenizer):
    engine = build_engine("cpu", loaded_model=model_fp32)
    try:
        bad = engine.submit(engine.prompts.make(9000), 4)  # longer than the 8192-token context
        good = engine.submit(tokenizer.encode("Hello"), 3, ignore_eos=True)
        engine.run_until_idle(max_rounds=50)
        assert bad.finish_reason == "rejected" and "context" in bad.error
        assert good.finished and len(good.output_ids) == 3
    finally:
        engine.close()


def test_cpu_prefill_advances_a_few_layers_a_round_by_default(model_fp32):
    """The CPU device's default token budget (4096) splits a 1024-token prompt into slices of 4 of 30 layers."""
    engine = build_engine("cpu", loaded_model=model_fp32)
    try:
        assert engine.config_record().split_forward_token_budget == 4096
        req = engine.submit(engine.prompts.make(1024), 1, ignore_eos=True)
        engine.step()
        batch = engine.scheduler.active.batch
        assert batch is not None and batch.layers_per_round == 4
        assert batch.reqs == [req]
    finally:
        engine.close()
