"""Token sampling: greedy, or temperature + top-p with a per-request seed.

Each sampling request owns a `torch.Generator` seeded from its `seed`, drawn once
per token, so what it samples does not depend on which other requests shared
its batch or in what order the scheduler ran them.
"""
from __future__ import annotations

import torch

from pdtop.engine.request import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The request's own random stream (CPU), or None for greedy requests."""
    return None if params.greedy else torch.Generator().manual_seed(params.seed)


def sample_one(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """One token from float32 logits `[vocab]`."""
    if params.greedy or gen is None:
        return int(greedy_tokens(logits[None])[0])
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(0) - sorted_p >= params.top_p
        sorted_p[drop] = 0.0
        choice = torch.multinomial(sorted_p, 1, generator=gen)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))


def greedy_tokens(logits: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """`logits.argmax(-1)` for `[n, vocab]`, same ties (first index) and NaN handling.

    torch's CPU argmax is not vectorized (about 1.3 ms for 32 x 49152 here); the max of
    each `chunk` of the row is, so find the first chunk holding the row's max, then the
    first index inside it.
    """
    n, vocab = logits.shape
    if vocab % chunk or logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    threads = torch.get_num_threads()
    if n > SERIAL_ROWS or threads == 1:
        return _chunked_argmax(logits, n, vocab, chunk)
    # a few rows on this thread alone: the amax of a 49152-word row is an OpenMP region, and waking
    # a PASSIVE team (beside the matmuls' spinning helpers) cost ~0.1 ms of a ~4 ms batch-1 step
    torch.set_num_threads(1)
    try:
        return _chunked_argmax(logits, n, vocab, chunk)
    finally:
        torch.set_num_threads(threads)


SERIAL_ROWS = 4  # rows up to which `greedy_tokens` runs on the calling thread alone


def _chunked_argmax(logits: torch.Tensor, n: int, vocab: int, chunk: int) -> torch.Tensor:
    blocks = logits.view(n, vocab // chunk, chunk)
    first = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks[torch.arange(n, device=logits.device), first].argmax(dim=-1)
    return first * chunk + inner


def sample(logits: torch.Tensor, params: list[SamplingParams], gens: list[torch.Generator | None],
           greedy: torch.Tensor | None = None) -> list[int]:
    """One token per row of `[n, vocab]` logits; greedy rows in one argmax (`greedy`, when the work that
    made the logits took it already)."""
    out = (greedy_tokens(logits) if greedy is None else greedy).tolist()
    for i, (p, g) in enumerate(zip(params, gens, strict=True)):
        if not p.greedy:
            out[i] = sample_one(logits[i], p, g)
    return out
