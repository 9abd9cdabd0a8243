"""The CPU decode fast path (cpu_decode.py) on the real SmolLM2 file at `--dtype gguf`: it takes
decode-only steps, gives the generic layer forward's logits bit for bit at every batch size and
layer range, declines what it does not cover, and keeps each thread's buffers apart."""
from __future__ import annotations

import threading

import pytest
import torch
from chat_prompts import chat_ids

from pdtop.engine.model import quant_kernels
from pdtop.engine.model.llama import ForwardBatch
from pdtop.engine.model.loader import load_model
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import append_token


@pytest.fixture(scope="module")
def model(gguf_path):
    if quant_kernels.kernels() is None:
        pytest.skip("no C compiler / OpenMP runtime for the CPU kernels here")
    m = load_model(gguf_path, dtype="gguf")
    if m.cpu_decode is None:
        pytest.skip("the CPU kernels the fast path calls are unavailable here")
    return m


def decoding(model, tokenizer, prompts: list[str]) -> tuple[ModelRunner, list[Request]]:
    """A runner with `prompts` prefilled and each request's first token appended."""
    runner = ModelRunner(model, kv_capacity_tokens=2048)
    reqs = [Request(i, chat_ids(tokenizer, p), SamplingParams(max_tokens=64, ignore_eos=True))
            for i, p in enumerate(prompts)]
    for r in reqs:
        runner.admit(r)
    for r, t in zip(reqs, runner.prefill(reqs), strict=True):
        append_token(r, t, 0.0, model.config.eos_ids)
    return runner, reqs


def both_paths(model, runner: ModelRunner, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """The next logits through the fast path and through the layers' forward (the same K/V is written twice)."""
    fast = runner.next_logits(reqs)
    kept, model.cpu_decode = model.cpu_decode, None
    try:
        generic = runner.next_logits(reqs)
    finally:
        model.cpu_decode = kept
    return fast, generic


def step(model, runner: ModelRunner, reqs: list[Request]) -> None:
    for r, t in zip(reqs, runner.decode(reqs), strict=True):
        append_token(r, t, 0.0, model.config.eos_ids)


@pytest.mark.parametrize("prompts", [["What is the capital of France?"],
                                     ["Name three colours of the rainbow.", "What is 12 times 7?",
                                      "Write a haiku about the sea."]], ids=["b1", "b3"])
def test_fast_path_gives_the_layers_logits_bit_for_bit(model, tokenizer, prompts):
    runner, reqs = decoding(model, tokenizer, prompts)
    for _ in range(5):
        fast, generic = both_paths(model, runner, reqs)
        assert torch.equal(fast, generic)
        step(model, runner, reqs)


def test_it_runs_decode_batches_and_declines_the_rest(model, tokenizer):
    runner, reqs = decoding(model, tokenizer, ["What is the capital of France?", "What is 12 times 7?"])
    ids, batch = runner._batch(reqs, [])
    groups = batch.decode_groups
    with torch.inference_mode():
        h = model.embed(torch.tensor(ids))
        rot = batch.rope(model)
        fd = model.cpu_decode
        whole = fd.run(h, batch, 0, model.num_layers, rot)
        assert whole is not None and whole.shape == h.shape
        # layer ranges compose, as pdmux's layer splits use them, and the input is left as it was
        first = fd.run(h, batch, 0, 11, rot)
        assert first is not None and not torch.equal(first, h)
        assert torch.equal(fd.run(first, batch, 11, model.num_layers, rot), whole)
        assert fd.run(h, batch, 3, 3, rot) is None  # no layers: the generic path returns h itself
        assert fd.run(h.to(torch.bfloat16), batch, 0, 1, rot) is None
        # two length groups (a long context beside a short one), prompt segments: the layers' forward
        two = ForwardBatch(kv=runner.kv, positions=batch.positions, slots=batch.slots, num_decode=2,
                           decode_groups=[groups[0], groups[0]])
        assert fd.run(h, two, 0, 1, rot) is None
        waiting = Request(9, [1, 2, 3])
        runner.admit(waiting)
        prompt = runner.prefill_begin([waiting])
        assert fd.run(prompt.hidden, prompt.batch, 0, 1, prompt.batch.rope(model)) is None


def test_bigger_then_smaller_batches_reuse_the_buffers(model, tokenizer):
    small, one = decoding(model, tokenizer, ["What is the capital of France?"])
    big, many = decoding(model, tokenizer, ["Name three colours of the rainbow."] * 5)
    for runner, reqs in ((small, one), (big, many), (small, one), (big, many)):
        fast, generic = both_paths(model, runner, reqs)
        assert torch.equal(fast, generic)
        step(model, runner, reqs)


def test_threads_decoding_at_once_keep_their_own_buffers(model, tokenizer):
    prompts = ["What is the capital of France?", "Explain photosynthesis in one sentence."]

    def answer(i: int, out: dict[int, list[int]]) -> None:
        runner, reqs = decoding(model, tokenizer, [prompts[i]])
        for _ in range(8):
            step(model, runner, reqs)
        out[i] = list(reqs[0].output_ids)

    want: dict[int, list[int]] = {}
    kept, model.cpu_decode = model.cpu_decode, None
    try:  # each alone, through the layers' forward
        answer(0, want)
        answer(1, want)
    finally:
        model.cpu_decode = kept
    got: dict[int, list[int]] = {}
    threads = [threading.Thread(target=answer, args=(i, got)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want
