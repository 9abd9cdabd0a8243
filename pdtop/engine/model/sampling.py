"""Token sampling: greedy, or temperature + top-p with a per-request seed.

Each sampling request owns a `torch.Generator` seeded from its `seed`, drawn once
per token, so what it samples does not depend on which other requests shared
its batch or in what order the scheduler ran them.
"""
from __future__ import annotations

import torch

from pdtop.engine.model import cpu_kernels
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


C_ARGMAX_ROWS = 8  # rows up to which `greedy_tokens` takes the C kernel on the CPU


def greedy_tokens(logits: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """`logits.argmax(-1)` for `[n, vocab]`, same ties (first index) and NaN handling.

    On the CPU, up to `C_ARGMAX_ROWS` float32 rows: the C kernel (`cpu_kernels.argmax`, on this
    thread: 10 us a 49152-word row, where torch's below took 0.1-0.2 ms of a batch-1 step). Else:
    torch's CPU argmax is not vectorized (about 1.3 ms for 32 x 49152 here); the max of each `chunk`
    of the row is, so find the first chunk holding the row's max, then the first index inside it
    (0.17 ms for 32 rows at 2 threads, the C kernel 0.4 ms).
    """
    n, vocab = logits.shape
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    if (n <= C_ARGMAX_ROWS and logits.dtype == torch.float32 and vocab and logits.stride(1) == 1
            and (kernel := cpu_kernels.argmax()) is not None):
        return kernel(logits)
    if vocab % chunk:
        return logits.argmax(dim=-1)
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
