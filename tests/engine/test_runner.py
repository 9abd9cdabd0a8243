"""ModelRunner on the real model: batching, layer-split prefill, chunked steps, bad input,
KV accounting, threads and seeded sampling."""
from __future__ import annotations

import threading

import pytest
import torch

from pdtop.engine.errors import KVCapacityError, PromptError
from pdtop.engine.runtime.runner import SamplingParams, length_groups

# See test_model.LOGIT_ATOL: different row counts may change float32 summation order.
LOGIT_ATOL = 1e-3

TEXTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi",
    "Explain in two sentences why the sky is blue, for a child of seven.",
]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}])) for t in TEXTS]


def params(n: int = 8, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def finish(r, seqs) -> None:
    while live := [s for s in seqs if not s.finished]:
        r.decode(live)


@pytest.fixture(scope="module")
def alone(model_fp32, prompts):
    """Reference: each prompt prefilled alone in one call, then decoded alone."""
    from pdtop.engine.runtime.runner import ModelRunner

    r = ModelRunner(model_fp32, kv_capacity_tokens=1024)
    logits, tokens = [], []
    for p in prompts:
        s = r.add_sequence(p, params())
        state = r.prefill_begin([s])
        r.prefill_layers(state, 0, model_fp32.num_layers)
        r.prefill_finish(state)
        logits.append(state.logits[0])
        finish(r, [s])
        tokens.append(s.output_ids)
    assert r.kv.used_tokens == 0
    return logits, tokens


def test_prompts_have_different_lengths(prompts):
    assert len({len(p) for p in prompts}) == len(prompts)


@pytest.mark.parametrize("per_call", [1, 3, 7, 30])
def test_batched_layer_split_prefill_matches_alone(runner, prompts, alone, per_call):
    r = runner()
    seqs = [r.add_sequence(p, params()) for p in prompts]
    state = r.prefill_begin(seqs)
    assert state.tokens == sum(map(len, prompts))
    for start in range(0, 30, per_call):
        r.prefill_layers(state, start, min(30, start + per_call))
    first = r.prefill_finish(state)
    for i, s in enumerate(seqs):
        assert (state.logits[i] - alone[0][i]).abs().max() <= LOGIT_ATOL
        assert s.num_cached == len(prompts[i]) and s.output_ids == [first[i]] == alone[1][i][:1]
    finish(r, seqs)
    assert [s.output_ids for s in seqs] == alone[1]


def test_batched_decode_of_different_lengths_matches_alone(runner, prompts):
    r = runner()
    seqs = [r.add_sequence(p, params(16)) for p in prompts]
    r.prefill(seqs)
    r.decode(seqs[:2])  # contexts now differ further: two sequences are one token ahead
    batched = r.next_logits(seqs)
    for i, s in enumerate(seqs):
        assert (r.next_logits([s])[0] - batched[i]).abs().max() <= LOGIT_ATOL
    before = [list(s.output_ids) for s in seqs]
    r.decode(seqs)
    assert [s.output_ids[:-1] for s in seqs] == before


@pytest.mark.parametrize("chunk,count", [(1, 3), (6, 4), (64, 4)])
def test_chunk_step_matches_whole_prompt_prefill(runner, prompts, alone, chunk, count):
    """Prompts 1.. arrive while earlier ones decode; each is prefilled in chunks mixed with decode rows."""
    r = runner()
    seqs = [r.add_sequence(p, params()) for p in prompts[:count]]
    r.prefill(seqs[:1])
    decoding = [seqs[0]]
    for s in seqs[1:]:
        first = None
        while first is None:
            live = [d for d in decoding if not d.finished]
            before = s.num_cached
            toks, first = r.chunk_step(live, s, chunk)
            assert len(toks) == len(live)
            assert s.num_cached == min(before + chunk, len(s.prompt_ids))
        assert s.output_ids == [first]
        decoding.append(s)
    finish(r, seqs)
    assert [s.output_ids for s in seqs] == alone[1][:count]


def test_chunk_step_without_chunk_is_a_decode(runner, prompts, alone):
    r = runner()
    seqs = [r.add_sequence(p, params()) for p in prompts[:2]]
    r.prefill(seqs)
    while not all(s.finished for s in seqs):
        toks, first = r.chunk_step([s for s in seqs if not s.finished], None, 0)
        assert first is None
    assert [s.output_ids for s in seqs] == alone[1][:2]


def test_bad_requests_change_nothing_and_runner_goes_on(runner, prompts, alone):
    r = runner(kv_capacity_tokens=160, block_size=16)  # 10 blocks
    cfg = r.config
    with pytest.raises(PromptError, match="empty prompt"):
        r.add_sequence([], params())
    with pytest.raises(PromptError, match=f"exceeds the model's context of {cfg.max_context}"):
        r.add_sequence(prompts[0], params(cfg.max_context))
    with pytest.raises(PromptError, match="outside the vocabulary"):
        r.add_sequence([1, cfg.vocab], params())
    with pytest.raises(PromptError, match="max_tokens"):
        r.add_sequence([1, 2], SamplingParams(max_tokens=0))
    with pytest.raises(PromptError, match="top_p"):
        r.add_sequence([1, 2], SamplingParams(temperature=1.0, top_p=0.0))
    with pytest.raises(KVCapacityError, match="KV cache full"):
        r.add_sequence(list(range(10, 10 + 161)), params())
    assert r.kv.used_tokens == 0 and r.kv.free_blocks == 10

    # fill the cache so that a decode step needs a block nobody has
    a = r.add_sequence(prompts[3], params(200))     # longest prompt
    b = r.add_sequence(list(range(200, 200 + 16 * (10 - len(a.table.blocks)))), params(200))
    assert r.kv.free_blocks == 0
    r.prefill([a, b])
    state = [(list(s.output_ids), s.num_cached, list(s.table.blocks)) for s in (a, b)]
    used = r.kv.used_tokens
    while a.num_cached + 1 <= len(a.table.blocks) * 16:
        r.decode([a])  # a fills its last block
        state[0] = (list(a.output_ids), a.num_cached, list(a.table.blocks))
        used = r.kv.used_tokens
    with pytest.raises(KVCapacityError, match="KV cache full"):
        r.decode([a, b])  # b needs a new block right away
    with pytest.raises(KVCapacityError):
        r.chunk_step([a, b], None, 0)
    assert [(list(s.output_ids), s.num_cached, list(s.table.blocks)) for s in (a, b)] == state
    assert r.kv.used_tokens == used

    r.free(b)
    r.free(b)  # idempotent
    r.free(a)
    assert r.kv.used_tokens == 0 and r.kv.free_blocks == 10
    s = r.add_sequence(prompts[0], params())
    r.prefill([s])
    finish(r, [s])
    assert s.output_ids == alone[1][0]


def test_kv_accounting_and_release_on_finish(runner, prompts):
    r = runner(kv_capacity_tokens=1024)
    s = r.add_sequence(prompts[2], params(3))
    assert r.kv.used_tokens == len(prompts[2]) and len(s.table.blocks) == -(-len(prompts[2]) // 16)
    r.prefill([s])
    r.decode([s])
    assert r.kv.used_tokens == len(prompts[2]) + 1 == s.num_cached
    r.decode([s])
    assert s.finished and s.finish_reason == "length" and len(s.output_ids) == 3
    assert r.kv.used_tokens == 0 and r.kv.used_blocks == 0
    with pytest.raises(ValueError, match="not decoding"):
        r.decode([s])


def test_eos_finishes(runner, prompts, model_fp32):
    r = runner()
    s = r.add_sequence(prompts[0], SamplingParams(max_tokens=64))
    r.prefill([s])
    finish(r, [s])
    assert s.finish_reason == "eos" and s.output_ids[-1] in model_fp32.config.eos_ids


def test_layer_calls_must_come_in_order(runner, prompts):
    r = runner()
    state = r.prefill_begin([r.add_sequence(prompts[0], params())])
    with pytest.raises(ValueError, match="next layer is 0"):
        r.prefill_layers(state, 1, 2)
    r.prefill_layers(state, 0, 10)
    with pytest.raises(ValueError, match="after 10 of 30"):
        r.prefill_finish(state)
    with pytest.raises(ValueError, match="next layer is 10"):
        r.prefill_layers(state, 10, 31)


def test_prefill_on_one_thread_while_decode_runs_on_another(runner, prompts, alone):
    """What the CPU device does: a layer-split prefill and decode steps at the same time."""
    r = runner()
    dec = [r.add_sequence(p, params()) for p in prompts[:2]]
    pre = [r.add_sequence(p, params()) for p in prompts[2:]]
    r.prefill(dec)
    errors: list[BaseException] = []
    state = r.prefill_begin(pre)

    def prefill_side() -> None:
        try:
            for start in range(0, 30, 2):
                r.prefill_layers(state, start, start + 2)
            r.prefill_finish(state)
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=prefill_side)
    t.start()
    while t.is_alive() or not all(s.finished for s in dec):
        live = [s for s in dec if not s.finished]
        if live:
            r.decode(live)
    t.join()
    assert not errors
    finish(r, pre)
    assert [s.output_ids for s in dec + pre] == alone[1]


def test_seeded_sampling_does_not_depend_on_batching(runner, prompts):
    p = dict(temperature=0.9, top_p=0.95, seed=1234)
    r = runner()
    lone = r.add_sequence(prompts[1], params(12, **p))
    r.prefill([lone])
    finish(r, [lone])
    others = [r.add_sequence(q, params(12, temperature=1.0, seed=i)) for i, q in enumerate(prompts)]
    again = r.add_sequence(prompts[1], params(12, **p))
    r.prefill(others[:2])
    r.decode(others[:2])
    r.prefill([others[2], again, others[3]])
    finish(r, others + [again])
    assert again.output_ids == lone.output_ids
    seeds = {tuple(s.output_ids) for s in others}
    assert len(seeds) > 1


def test_top_p_keeps_only_the_nucleus():
    from pdtop.engine.model.sampling import sample_one

    logits = torch.tensor([5.0, 4.0, 0.0, -1.0, -2.0])
    gen = torch.Generator().manual_seed(0)
    # p(0) ~ 0.72, p(1) ~ 0.27: top_p 0.9 keeps exactly tokens 0 and 1
    seen = {sample_one(logits, SamplingParams(temperature=1.0, top_p=0.9), gen) for _ in range(300)}
    assert seen == {0, 1}
    seen = {sample_one(logits, SamplingParams(temperature=1.0, top_p=0.5), gen) for _ in range(50)}
    assert seen == {0}
    assert sample_one(logits, SamplingParams(), None) == 0


def test_greedy_tokens_is_argmax():
    from pdtop.engine.model.sampling import greedy_tokens

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 49152, generator=g)
    x[1, 7] = x[1, 40000] = 100.0  # a tie: the first index wins
    x[2, 300] = float("nan")
    x[3] = 1.0                       # all equal
    x[4, -1] = 100.0                 # last position
    assert torch.equal(greedy_tokens(x), x.argmax(-1))
    y = torch.randn(3, 1000, generator=g)  # vocab not a multiple of the chunk
    assert torch.equal(greedy_tokens(y), y.argmax(-1))


def test_length_groups_keep_similar_contexts_together():
    assert length_groups([100, 90, 120]) == [[1, 0, 2]]
    assert length_groups([100, 1100, 90, 1000]) == [[2, 0], [3, 1]]
    assert length_groups([5]) == [[0]]


def test_decode_of_widely_different_lengths_matches_alone(runner, tokenizer):
    """Short rows and a 900-token row fall in separate length groups; logits match each row alone."""
    r = runner()
    text = tokenizer.encode("The river carries sand toward the sea. " * 120)
    seqs = [r.add_sequence(text[:n], params(4)) for n in (7, 30, 900)]
    r.prefill(seqs)
    assert len(length_groups([s.num_cached + 1 for s in seqs])) == 2
    batched = r.next_logits(seqs)
    for i, s in enumerate(seqs):
        assert (r.next_logits([s])[0] - batched[i]).abs().max() <= LOGIT_ATOL
