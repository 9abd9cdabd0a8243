"""pdmux's split prefill batch: whole prompts, or a long prompt chunk by chunk (`chunked_prefill_size`).

Newer SGLang (docs/levels.md names the commit) forms pdmux's split prefill batch with its usual
prefill adder, so its server flag `--chunked-prefill-size` applies there too: a prompt longer than
the chunk size is prefilled one chunk at a time, each chunk a split prefill of its own (`k =
min(L, max(1, budget // chunk tokens))` layers a slice, capped while decode runs), its K/V cached
before the next chunk starts, the level chosen again between chunks; the first token comes from
the last chunk. pdtop reads the size from the pdmux config's `chunked_prefill_size` (0, the
default: whole prompts, as before); its `chunk_size` stays the chunked policy's.

pdtop's one difference: a chunked prompt is prefilled alone (SGLang's adder may pack whole short
prompts before it in the same chunk's budget); prompts that fit the size are batched whole, at
most the size's tokens a batch.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic

from pdtop.engine.devices.base import Work
from pdtop.engine.records import PrefillProgress
from pdtop.engine.request import Request
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.scheduling.splits import prefill_layers_per_step, slice_layers

Span = tuple[int, int]  # a chunk: (its first prompt token, its tokens)


@dataclass
class PrefillBatch(Generic[S]):
    reqs: list[Request]
    state: S  # what the executor's `prefill_begin` made; only the executor reads it
    tokens: int  # the tokens this prefill runs (a chunk's own)
    layers_per_round: int  # the current slice's: `budget_layers`, capped while decode runs
    budget_layers: int = 0  # min(L, max(1, budget // tokens)), set when the batch starts
    layers_done: int = 0
    submitted_end: int = 0  # layers submitted so far (>= layers_done while slices are in flight)
    in_flight: deque[tuple[int, Work]] = field(default_factory=deque)  # (end layer, work) of each unfinished slice
    charged: float = 0.0  # the fraction of the oldest slice in flight charged to rounds so far
    span: Span | None = None  # a chunk of its one request's prompt; None: whole prompts

    def progress(self, num_layers: int) -> PrefillProgress:
        """Its `round.prefills` entry; a chunk's tells the prompt's tokens, those cached before this
        chunk (`tokens_done`) and this chunk's layers."""
        if self.span is None:
            return PrefillProgress([r.id for r in self.reqs], self.tokens, self.layers_done, num_layers,
                                   self.layers_per_round)
        r = self.reqs[0]
        return PrefillProgress([r.id], r.prompt_len, self.layers_done, num_layers, self.layers_per_round, self.span[0])


def next_slice(pf: PrefillBatch[S], num_layers: int, cap: int, decoding: bool, whole_alone: bool) -> int:
    """Layers of `pf`'s next slice: the budget's, capped at `cap` while decode runs (`slice_layers`).
    With nothing decoding and `whole_alone`, all the layers left in one slice (newer SGLang: splitting
    only helps decode run between slices); the CPU device keeps slicing, so a lone prompt's progress shows."""
    if whole_alone and not decoding:
        return num_layers - pf.submitted_end
    return slice_layers(pf.budget_layers, cap, decoding)


def chunk_tokens(req: Request, chunk_size: int) -> int | None:
    """The tokens of `req`'s next chunk under `chunk_size` (0: off); None when its prompt goes whole."""
    left = req.prompt_len - req.num_cached
    if req.num_cached == 0 and (chunk_size <= 0 or left <= chunk_size):
        return None
    return min(chunk_size, left) if chunk_size > 0 else left


def between_chunks(req: Request, num_layers: int, chunk_size: int, budget: int) -> PrefillProgress:
    """The `round.prefills` entry of a chunked prompt whose next chunk starts next round."""
    n = chunk_tokens(req, chunk_size) or req.prompt_len - req.num_cached
    return PrefillProgress([req.id], req.prompt_len, 0, num_layers, prefill_layers_per_step(n, num_layers, budget),
                           req.num_cached)


def begin(executor: Executor[S], reqs: list[Request], num_layers: int, budget: int,
          chunk_size: int = 0) -> PrefillBatch[S]:
    """The split prefill of `reqs`: whole prompts, or the next chunk of a lone prompt longer than `chunk_size`."""
    n = chunk_tokens(reqs[0], chunk_size) if len(reqs) == 1 else None
    tokens = sum(r.prompt_len for r in reqs) if n is None else n
    k = prefill_layers_per_step(tokens, num_layers, budget)
    span = None if n is None else (reqs[0].num_cached, n)
    return PrefillBatch(reqs, executor.prefill_begin(reqs, n), tokens, k, k, span=span)
