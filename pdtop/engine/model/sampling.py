"""Token sampling: greedy, or temperature + min-p + top-k + top-p with a per-request seed.

Each sampling request owns a `torch.Generator` seeded from its `seed`, drawn once
per token, so what it samples does not depend on which other requests shared
its batch or in what order the scheduler ran them.

The parameters past temperature and top-p mean what vLLM 0.33's sampler makes of them, in its
order: log-probabilities of the raw logits (its default `logprobs_mode`), then the `min_tokens`
mask, the repetition penalty, temperature, min-p, top-k, top-p. A row that asks for none of the
logit work (`SamplingParams.plain`) takes the batch's one argmax or `sample_one` as before; only
the rows that ask pay for theirs.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pdtop.engine.model import cpu_kernels
from pdtop.engine.request import Request, SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The request's own random stream (CPU), or None for greedy requests."""
    return None if params.greedy else torch.Generator().manual_seed(params.seed)


def sample_one(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """One token from float32 logits `[vocab]`."""
    if params.greedy or gen is None:
        return int(greedy_tokens(logits[None])[0])
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)
    if params.min_p > 0:  # below min_p x the most likely token's probability: out
        probs[probs < params.min_p * probs.max()] = 0.0
    vocab = probs.numel()
    if 0 < params.top_k < vocab or params.top_p < 1.0:
        sorted_p, order = probs.topk(params.top_k) if 0 < params.top_k < vocab else probs.sort(descending=True)
        if params.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p of what is left (the first token always stays)
            mass = sorted_p.cumsum(0)
            sorted_p[mass - sorted_p >= params.top_p * mass[-1]] = 0.0
        choice = torch.multinomial(sorted_p, 1, generator=gen)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))


def _processed(logits: torch.Tensor, req: Request, eos_ids: Sequence[int]) -> int:
    """One token for a row that is not `plain`: raw log-probability recorded, `min_tokens` mask and
    repetition penalty applied, then greedy or `sample_one`."""
    p = req.params
    row = logits.float()
    raw = row.log_softmax(-1) if p.logprobs else None
    if len(req.output_ids) < p.min_tokens or p.repetition_penalty != 1.0:
        row = row.clone()
    if len(req.output_ids) < p.min_tokens:  # vLLM masks every stop token, ignore_eos or not
        row[torch.as_tensor(sorted({*eos_ids, *p.stop_token_ids}), dtype=torch.long, device=row.device)] = -torch.inf
    if p.repetition_penalty != 1.0:  # every token of the prompt and the output so far
        seen = torch.as_tensor(req.prompt_ids + req.output_ids, dtype=torch.long, device=row.device).unique()
        hit = row[seen]
        row[seen] = torch.where(hit > 0, hit / p.repetition_penalty, hit * p.repetition_penalty)
    token = int(greedy_tokens(row[None])[0]) if p.greedy else sample_one(row, p, req.generator)
    if raw is not None:
        req.logprobs.append(float(raw[token]))
    return token


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


def sample(logits: torch.Tensor, reqs: Sequence[Request], eos_ids: Sequence[int],
           greedy: torch.Tensor | None = None) -> list[int]:
    """One token per row of `[n, vocab]` logits; plain greedy rows in one argmax (`greedy`, when the work
    that made the logits took it already). `eos_ids`: what `min_tokens` masks besides `stop_token_ids`."""
    out = (greedy_tokens(logits) if greedy is None else greedy).tolist()
    for i, r in enumerate(reqs):
        p = r.params
        if not p.plain:
            out[i] = _processed(logits[i], r, eos_ids)
        elif not p.greedy:
            out[i] = sample_one(logits[i], p, r.generator)
    return out
