"""ModelRunner on the real model: batching, layer-split prefill, chunked steps, bad input,
KV accounting, threads and seeded sampling. The runner returns tokens; the tests hand them
to the scheduler's `append_token`, as the scheduler does."""
from __future__ import annotations

import itertools
import threading

import pytest
import torch

from pdtop.engine.errors import KVCapacityError, PromptError
from pdtop.engine.request import Request, RequestStatus, SamplingParams
from pdtop.engine.runtime.runner import length_groups
from pdtop.engine.scheduling.tokens import append_token, generate

# See test_model.LOGIT_ATOL: different row counts may change float32 summation order.
LOGIT_ATOL = 1e-3

TEXTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi",
    "Explain in two sentences why the sky is blue, for a child of seven.",
]
_ids = itertools.count()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}])) for t in TEXTS]


def params(n: int = 8, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def admit(r, prompt: list[int], p: SamplingParams | None = None) -> Request:
    req = Request(next(_ids), list(prompt), p or params())
    r.admit(req)
    return req


def take(r, reqs: list[Request], tokens: list[int]) -> None:
    """What the scheduler does with sampled tokens: append each, free the requests that finished."""
    for req, tok in zip(reqs, tokens, strict=True):
        if append_token(req, tok, 0.0, r.config.eos_ids):
            r.free(req)


def finish(r, reqs: list[Request]) -> None:
    while live := [q for q in reqs if not q.finished]:
        take(r, live, r.decode(live))


@pytest.fixture(scope="module")
def alone(model_fp32, prompts):
    """Reference: each prompt prefilled alone in one call, then decoded alone."""
    from pdtop.engine.runtime.runner import ModelRunner

    r = ModelRunner(model_fp32, kv_capacity_tokens=1024)
    logits, tokens = [], []
    for p in prompts:
        s = admit(r, p)
        state = r.prefill_begin([s])
        r.prefill_layers(state, 0, model_fp32.num_layers)
        take(r, [s], r.prefill_finish(state))
        logits.append(state.logits[0])
        finish(r, [s])
        tokens.append(s.output_ids)
    assert r.kv.pool.used_tokens == 0
    return logits, tokens


def test_prompts_have_different_lengths(prompts):
    assert len({len(p) for p in prompts}) == len(prompts)


@pytest.mark.parametrize("per_call", [1, 3, 7, 30])
def test_batched_layer_split_prefill_matches_alone(runner, prompts, alone, per_call):
    r = runner()
    seqs = [admit(r, p) for p in prompts]
    state = r.prefill_begin(seqs)
    assert state.tokens == sum(map(len, prompts))
    for start in range(0, 30, per_call):
        r.prefill_layers(state, start, min(30, start + per_call))
    first = r.prefill_finish(state)
    assert all(s.output_ids == [] for s in seqs)  # returned, not appended
    take(r, seqs, first)
    for i, s in enumerate(seqs):
        assert (state.logits[i] - alone[0][i]).abs().max() <= LOGIT_ATOL
        assert s.num_cached == len(prompts[i]) and s.output_ids == [first[i]] == alone[1][i][:1]
    finish(r, seqs)
    assert [s.output_ids for s in seqs] == alone[1]


def test_batched_decode_of_different_lengths_matches_alone(runner, prompts):
    r = runner()
    seqs = [admit(r, p, params(16)) for p in prompts]
    take(r, seqs, r.prefill(seqs))
    take(r, seqs[:2], r.decode(seqs[:2]))  # contexts now differ further: two requests are one token ahead
    batched = r.next_logits(seqs)
    for i, s in enumerate(seqs):
        assert (r.next_logits([s])[0] - batched[i]).abs().max() <= LOGIT_ATOL
    before = [list(s.output_ids) for s in seqs]
    tokens = r.decode(seqs)
    assert [s.output_ids for s in seqs] == before  # the runner appends nothing
    take(r, seqs, tokens)
    assert [s.output_ids[:-1] for s in seqs] == before


@pytest.mark.parametrize("chunk,count", [(1, 3), (6, 4), (64, 4)])
def test_chunk_step_matches_whole_prompt_prefill(runner, prompts, alone, chunk, count):
    """Prompts 1.. arrive while earlier ones decode; each is prefilled in chunks mixed with decode rows."""
    r = runner()
    seqs = [admit(r, p) for p in prompts[:count]]
    take(r, seqs[:1], r.prefill(seqs[:1]))
    decoding = [seqs[0]]
    for s in seqs[1:]:
        first = None
        while first is None:
            live = [d for d in decoding if not d.finished]
            before = s.num_cached
            toks, first = r.chunk_step(live, s, chunk)
            assert len(toks) == len(live)
            assert s.num_cached == min(before + chunk, len(s.prompt_ids))
            take(r, live, toks)
        take(r, [s], [first])
        assert s.output_ids == [first]
        decoding.append(s)
    finish(r, seqs)
    assert [s.output_ids for s in seqs] == alone[1][:count]


def test_chunk_step_without_chunk_is_a_decode(runner, prompts, alone):
    r = runner()
    seqs = [admit(r, p) for p in prompts[:2]]
    take(r, seqs, r.prefill(seqs))
    while live := [s for s in seqs if not s.finished]:
        toks, first = r.chunk_step(live, None, 0)
        assert first is None
        take(r, live, toks)
    assert [s.output_ids for s in seqs] == alone[1][:2]


def test_bad_requests_change_nothing_and_runner_goes_on(runner, prompts, alone):
    r = runner(kv_capacity_tokens=160, block_size=16)  # 10 blocks
    pool, cfg = r.kv.pool, r.config
    with pytest.raises(PromptError, match="empty prompt"):
        admit(r, [])
    with pytest.raises(PromptError, match=f"exceeds the model's context of {cfg.max_context}"):
        admit(r, prompts[0], params(cfg.max_context))
    with pytest.raises(PromptError, match="outside the vocabulary"):
        admit(r, [1, cfg.vocab])
    with pytest.raises(PromptError, match="max_tokens"):
        admit(r, [1, 2], SamplingParams(max_tokens=0))
    with pytest.raises(PromptError, match="top_p"):
        admit(r, [1, 2], SamplingParams(temperature=1.0, top_p=0.0))
    with pytest.raises(PromptError, match="KV cache too small"):  # could never fit: waiting would be forever
        admit(r, list(range(10, 10 + 150)), params(20))
    assert pool.used_tokens == 0 and pool.free_blocks == 10 and pool.committed_blocks == 0

    # admission promises prompt + max_tokens: a request that does not fit beside the others waits
    a = admit(r, prompts[3], params(8))  # longest prompt
    promised_a = pool.blocks_for(len(prompts[3]) + 8)
    assert (len(a.table.blocks), pool.committed_blocks) == (-(-len(prompts[3]) // 16), promised_a)
    rest = 16 * (10 - promised_a)
    with pytest.raises(KVCapacityError, match="KV cache full"):
        admit(r, list(range(200, 200 + rest)), params(1))  # one token more than the blocks left
    assert pool.committed_blocks == promised_a
    b = admit(r, list(range(200, 200 + rest - 1)), params(1))
    assert pool.committed_blocks == 10
    take(r, [a, b], r.prefill([a, b]))
    assert b.finished and pool.committed_blocks == promised_a  # b's one token ended it and freed its KV
    finish(r, [a])  # growth within a promise never fails
    assert a.output_ids == alone[1][3][:8] and pool.used_tokens == 0 and pool.free_blocks == 10

    # a caller that decodes past max_tokens grows past the promise: free blocks or KVCapacityError
    a = admit(r, prompts[3], params(8))
    b = admit(r, list(range(200, 200 + rest - 2)), params(2))  # stays: every block is held or promised
    take(r, [a, b], r.prefill([a, b]))
    a.params.max_tokens = 1000  # not what a scheduler does: it keeps a within its promise
    while a.num_cached + 1 <= promised_a * 16:
        take(r, [a], r.decode([a]))
    state = (list(a.output_ids), a.num_cached, list(a.table.blocks), pool.used_tokens)
    with pytest.raises(KVCapacityError, match="KV cache full"):
        r.decode([a])
    with pytest.raises(KVCapacityError):
        r.chunk_step([a], None, 0)
    assert (list(a.output_ids), a.num_cached, list(a.table.blocks), pool.used_tokens) == state

    r.free(a)
    r.free(a)  # idempotent
    r.free(b)
    assert pool.used_tokens == 0 and pool.free_blocks == 10 and pool.committed_blocks == 0
    s = admit(r, prompts[0])
    take(r, [s], r.prefill([s]))
    finish(r, [s])
    assert s.output_ids == alone[1][0]


def test_kv_accounting_and_release_on_finish(runner, prompts):
    r = runner(kv_capacity_tokens=1024)
    pool = r.kv.pool
    s = admit(r, prompts[2], params(3))
    assert pool.used_tokens == len(prompts[2]) and len(s.table.blocks) == -(-len(prompts[2]) // 16)
    take(r, [s], r.prefill([s]))
    take(r, [s], r.decode([s]))
    assert pool.used_tokens == len(prompts[2]) + 1 == s.num_cached
    take(r, [s], r.decode([s]))
    assert s.finished and s.finish_reason == "length" and len(s.output_ids) == 3
    assert pool.used_tokens == 0 and pool.used_blocks == 0
    with pytest.raises(ValueError, match="not decoding"):
        r.decode([s])


def test_a_token_must_be_appended_between_steps(runner, prompts):
    """The runner returns tokens and never appends them: decoding again without appending is refused."""
    r = runner()
    s = admit(r, prompts[2])
    with pytest.raises(ValueError, match="not decoding"):
        r.decode([s])  # not prefilled
    first = r.prefill([s])
    assert s.output_ids == [] and s.status is RequestStatus.WAITING
    with pytest.raises(ValueError, match="not decoding"):
        r.decode([s])  # its first token was not appended
    take(r, [s], first)
    assert s.status is RequestStatus.DECODING
    r.decode([s])
    with pytest.raises(ValueError, match="one token must be appended per step"):
        r.decode([s])


def test_free_is_refused_while_the_prefill_is_in_flight(runner, prompts):
    r = runner()
    s = admit(r, prompts[0])
    state = r.prefill_begin([s])
    r.prefill_layers(state, 0, 10)
    with pytest.raises(ValueError, match="in flight"):
        r.free(s)
    assert s.table.blocks  # nothing was released
    r.prefill_layers(state, 10, 30)
    r.prefill_finish(state)
    r.free(s)
    assert r.kv.pool.used_tokens == 0


def test_generate_runs_one_request_through_the_schedulers_rule(runner, prompts, alone):
    r = runner()
    req = Request(0, prompts[1], params())
    assert list(generate(r, req)) == req.output_ids == alone[1][1]
    assert req.finish_reason == "length" and len(req.token_times) == 8 and r.kv.pool.used_tokens == 0
    stopped = Request(1, prompts[1], params())
    for _ in generate(r, stopped):
        break  # a caller that stops early still frees the KV
    assert stopped.output_ids == alone[1][1][:1] and r.kv.pool.used_tokens == 0


def test_eos_finishes(runner, prompts, model_fp32):
    r = runner()
    s = admit(r, prompts[0], SamplingParams(max_tokens=64))
    take(r, [s], r.prefill([s]))
    finish(r, [s])
    assert s.finish_reason == "eos" and s.output_ids[-1] in model_fp32.config.eos_ids


def test_layer_calls_must_come_in_order(runner, prompts):
    r = runner()
    state = r.prefill_begin([admit(r, prompts[0])])
    with pytest.raises(ValueError, match="next layer is 0"):
        r.prefill_layers(state, 1, 2)
    r.prefill_layers(state, 0, 10)
    with pytest.raises(ValueError, match="after 10 of 30"):
        r.prefill_finish(state)
    with pytest.raises(ValueError, match="next layer is 10"):
        r.prefill_layers(state, 10, 31)
    r.prefill_layers(state, 10, 30)
    assert len(r.prefill_finish(state)) == 1
    with pytest.raises(ValueError, match="already finished"):  # a second finish, not a crash on dropped activations
        r.prefill_finish(state)


def test_prefill_on_one_thread_while_decode_runs_on_another(runner, prompts, alone):
    """What the CPU device does: a layer-split prefill and decode steps at the same time."""
    r = runner()
    dec = [admit(r, p) for p in prompts[:2]]
    pre = [admit(r, p) for p in prompts[2:]]
    take(r, dec, r.prefill(dec))
    errors: list[BaseException] = []
    firsts: list[int] = []
    state = r.prefill_begin(pre)

    def prefill_side() -> None:
        try:
            for start in range(0, 30, 2):
                r.prefill_layers(state, start, start + 2)
            firsts.extend(r.prefill_finish(state))
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=prefill_side)
    t.start()
    while t.is_alive() or not all(s.finished for s in dec):
        live = [s for s in dec if not s.finished]
        if live:
            take(r, live, r.decode(live))
    t.join()
    assert not errors
    take(r, pre, firsts)
    finish(r, pre)
    assert [s.output_ids for s in dec + pre] == alone[1]


@pytest.mark.parametrize("p", [{"temperature": 0.9, "top_p": 0.95, "seed": 1234},
                               {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "top_k": 20, "min_p": 0.05,
                                "repetition_penalty": 1.3, "min_tokens": 6, "logprobs": True}],
                         ids=["plain", "vLLM's extensions"])
def test_seeded_sampling_does_not_depend_on_batching(runner, prompts, p):
    r = runner()
    lone = admit(r, prompts[1], params(12, **p))
    take(r, [lone], r.prefill([lone]))
    finish(r, [lone])
    others = [admit(r, q, params(12, temperature=1.0, seed=i)) for i, q in enumerate(prompts)]
    again = admit(r, prompts[1], params(12, **p))
    take(r, others[:2], r.prefill(others[:2]))
    take(r, others[:2], r.decode(others[:2]))
    batch = [others[2], again, others[3]]
    take(r, batch, r.prefill(batch))
    finish(r, [*others, again])
    assert again.output_ids == lone.output_ids
    assert len(again.logprobs) == (12 if p.get("logprobs") else 0)
    assert again.logprobs == pytest.approx(lone.logprobs, abs=LOGIT_ATOL)
    seeds = {tuple(s.output_ids) for s in others}
    assert len(seeds) > 1


def test_top_k_and_min_p_narrow_what_is_sampled():
    from pdtop.engine.model.sampling import sample_one

    logits = torch.tensor([5.0, 4.0, 3.9, -1.0, -2.0])  # p ~ 0.58, 0.21, 0.19, ...
    gen = torch.Generator().manual_seed(0)

    def seen(**kw) -> set[int]:
        return {sample_one(logits, SamplingParams(temperature=1.0, **kw), gen) for _ in range(300)}

    assert seen(top_k=2) == {0, 1} and seen(top_k=1) == {0}
    assert seen(top_k=0) >= {0, 1, 2} and seen(top_k=-1) >= {0, 1, 2}  # off, as vLLM 0.33 reads 0 and -1
    assert seen(min_p=0.3) == {0, 1, 2} and seen(min_p=1.0) == {0}
    # vLLM's order: min_p, then top_k, then top_p over what is left (0.73 of it: tokens 0 and 1 of 0, 1, 2)
    assert seen(top_k=3, top_p=0.7) == {0, 1}


def test_penalty_min_tokens_and_stop_tokens_in_the_sampler_and_the_stop_rule():
    from pdtop.engine.model.sampling import sample

    logits = torch.tensor([[3.0, 2.0, -1.0, -1.5, 0.5]] * 3)
    eos = (0,)
    penalized = Request(1, [0, 3], SamplingParams(repetition_penalty=2.0))  # 3.0 -> 1.5, -1.5 -> -3.0
    held = Request(2, [1], SamplingParams(min_tokens=2, stop_token_ids=frozenset({1}), logprobs=True))
    plain = Request(3, [1], SamplingParams())
    assert sample(logits, [penalized, held, plain], eos) == [1, 4, 0]  # held: 0 (eos) and 1 (stop) masked
    assert held.logprobs == [pytest.approx(float(torch.log_softmax(logits[1], -1)[4]))]  # the raw logits'
    append_token(held, 4, 0.0, eos)
    assert sample(logits[:1], [held], eos) == [4]
    append_token(held, 4, 0.0, eos)
    assert sample(logits[:1], [held], eos) == [0]  # two tokens: no longer masked
    assert append_token(held, 1, 0.0, eos) and held.finish_reason == "eos"  # a stop token ends it
    ignoring = Request(4, [1], SamplingParams(ignore_eos=True, stop_token_ids=frozenset({2})))
    assert not append_token(ignoring, 0, 0.0, eos) and append_token(ignoring, 2, 0.0, eos)
    early = Request(5, [1], SamplingParams(min_tokens=1, stop_token_ids=frozenset({2})))  # as a simulator's token
    assert not append_token(early, 2, 0.0, eos) and append_token(early, 2, 0.0, eos)


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


@pytest.mark.parametrize("kernel", [True, False], ids=["C kernel", "torch"])
def test_greedy_tokens_is_argmax(kernel, monkeypatch):
    from pdtop.engine.model import cpu_kernels
    from pdtop.engine.model.sampling import greedy_tokens

    if not kernel:
        monkeypatch.setattr(cpu_kernels, "argmax", lambda isa=None: None)
    elif cpu_kernels.argmax() is None:
        pytest.skip("the CPU kernels are unavailable here")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 49152, generator=g)
    x[1, 7] = x[1, 40000] = 100.0  # a tie: the first index wins
    x[2, 300] = float("nan")
    x[3] = 1.0                       # all equal
    x[4, -1] = 100.0                 # last position
    assert torch.equal(greedy_tokens(x), x.argmax(-1))
    assert torch.equal(greedy_tokens(x[1:4]), x[1:4].argmax(-1))
    many = x.repeat(4, 1)  # past C_ARGMAX_ROWS: torch's way whatever `kernel`
    assert torch.equal(greedy_tokens(many), many.argmax(-1))
    assert torch.equal(greedy_tokens(x[:, 5:40005]), x[:, 5:40005].argmax(-1))  # strided rows
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
    seqs = [admit(r, text[:n], params(4)) for n in (7, 30, 900)]
    take(r, seqs, r.prefill(seqs))
    assert len(length_groups([s.num_cached + 1 for s in seqs])) == 2
    batched = r.next_logits(seqs)
    for i, s in enumerate(seqs):
        assert (r.next_logits([s])[0] - batched[i]).abs().max() <= LOGIT_ATOL
