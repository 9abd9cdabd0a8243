"""What the scheduler runs work on: `Executor[S]`, the real model's runner or the simulator's bookkeeping.

An executor admits and frees requests, runs decode steps, layer-split prefills and chunked
steps, and returns the tokens it samples (the scheduler appends them); `decode_work`,
`prefill_work` and `chunk_work` wrap those calls as device `Work`, priced the same way for
both (`roofline/cost.py`, the seed's roofline terms), so bytes moved and FLOPs per round are
reported for every device. Both count KV the same way: a `BlockPool` (inside the runner's
`KVCache`, or alone for the simulator) is the one owner of KV reservation. `check_request`
is the one check of a request that could never run, shared by `admit` and the HTTP API.

`ModelRunner` (`runner.py`) is the real model's executor; `SimExecutor` (here) has no
weights: its tokens are placeholders and requests finish by length.

`Executor[S]`: S is what `prefill_begin` makes and the prefill slices carry (the runner's
`PrefillState`; the simulator's `SimPrefill`). Only the executor looks inside it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pdtop.engine.devices.base import Work
from pdtop.engine.errors import PromptError
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.request import BlockTable, Request, SamplingParams
from pdtop.engine.roofline import cost
from pdtop.engine.runtime.block_pool import BlockPool

S = TypeVar("S")  # an executor's in-flight prefill state
ChunkTokens = tuple[list[int], int | None]  # a chunked step's decode tokens, and the prompt's first token once it ends
# (work "prefill" | "decode" | "mixed", phase "attn" | "mlp", layer, start, end): `llama.PhaseTimer`
# with the work the layer ran for (`set_layer_trace`)
LayerTrace = Callable[[str, str, int, float, float], None]


class Executor(ABC, Generic[S]):
    cfg: ModelConfig
    pool: BlockPool  # the one count of KV blocks held and promised
    dtype_bytes: int = 2

    # -- requests --------------------------------------------------------------------------
    def check_request(self, prompt_tokens: int, params: SamplingParams, what: str = "request") -> None:
        """PromptError if such a request could never run here: bad sampling parameters, an empty
        prompt, prompt + max_tokens past the context, or more KV than the whole cache (waiting would
        be forever). `admit` asks it; the HTTP API asks it before it queues a request."""
        params.validate()
        if prompt_tokens < 1:
            raise PromptError("empty prompt: a request needs at least one token")
        bad = [t for t in params.stop_token_ids if not 0 <= t < self.cfg.vocab]
        if bad:  # vLLM 0.33's rule: they index the logits (`min_tokens` masks them)
            raise PromptError(f"token id(s) {bad[:8]} in stop_token_ids are outside the vocabulary "
                              f"(0..{self.cfg.vocab - 1})")
        context = self.cfg.max_context
        if prompt_tokens + params.max_tokens > context:
            raise PromptError(f"prompt of {prompt_tokens} tokens + max_tokens {params.max_tokens} exceeds the "
                              f"model's context of {context} tokens")
        self.pool.check_fits(prompt_tokens, params.max_tokens, what)

    @abstractmethod
    def admit(self, req: Request, promise: bool = True) -> None:
        """Reserve KV for the prompt and promise room for its max_tokens: KVCapacityError (nothing
        changed) when that does not fit now, PromptError when it never can (`check_request`).
        Without `promise`, the prompt's blocks only (a disagg prefill instance: decode holds the rest)."""

    def free(self, req: Request) -> None:
        """Release a request's KV blocks (idempotent)."""
        self.pool.release(req.table)

    def kv_usage(self) -> tuple[int, int]:
        """(used tokens, capacity tokens)."""
        return self.pool.used_tokens, self.pool.capacity_tokens

    def describe(self) -> dict[str, Any]:
        """How the work runs (dtype, KV cache, kernels), for `Engine.describe().runtime`: for people, and a
        plain dict, since what it holds depends on the executor (the runner's adds dtype, CUDA's its graphs)."""
        return {"kv_cache": {"tokens": self.pool.capacity_tokens}}

    def set_layer_trace(self, trace: LayerTrace | None) -> bool:
        """Tell `trace` each model layer's attention and MLP times, or stop (None); False where no
        layers run (the simulator), so nothing will be told."""
        return False

    # -- a second instance (the disagg policy's prefill instance) ------------------------------
    @abstractmethod
    def twin(self) -> Executor[S]:
        """An executor of the same model with a KV pool of its own, as large as this one's."""

    @abstractmethod
    def copy_kv_from(self, src: Executor[S], src_table: BlockTable, dst_table: BlockTable, tokens: int) -> None:
        """Copy the K/V of the first `tokens` tokens from `src`'s pool (`src_table`) into this pool's `dst_table`."""

    # -- work: each returns tokens, never appends them ----------------------------------------
    @abstractmethod
    def decode(self, reqs: list[Request]) -> list[int]:
        """One token for each decoding request, in one batch."""

    @abstractmethod
    def prefill_begin(self, reqs: list[Request], tokens: int | None = None) -> S:
        """A prefill of whole prompts, or with `tokens` one request's next chunk of that many tokens;
        in flight until `prefill_finish` (or `prefill_drop`)."""

    @abstractmethod
    def prefill_layers(self, state: S, start: int, end: int) -> None:
        """Layers [start, end) of an in-flight prefill, in order."""

    @abstractmethod
    def prefill_finish(self, state: S) -> list[int]:
        """The first tokens, sampled from the logits the last prefill slice made (the final norm and
        LM head run inside that slice, on the prefill side); `[]` after a chunk that does not end its prompt.

        Run by the scheduler thread after the last layers are done, not inside the
        prefill work: on CUDA, sampling syncs, so it must not sit in the launched work.
        """

    def prefill_drop(self, state: S) -> None:
        """Forget an in-flight prefill whose requests were all aborted, with no slice of it running;
        its requests' KV can then be released. Nothing to forget by default."""

    @abstractmethod
    def chunk_step(self, decode: list[Request], req: Request | None, n: int) -> ChunkTokens:
        """One step: a decode token for each of `decode` plus the next `n` prompt tokens of `req`."""

    def prefill(self, reqs: list[Request]) -> list[int]:
        """A whole prefill in one call: the first tokens."""
        state = self.prefill_begin(reqs)
        self.prefill_layers(state, 0, self.cfg.num_layers)
        return self.prefill_finish(state)

    # -- the same calls as device work, priced ---------------------------------------------------
    def decode_work(self, reqs: list[Request]) -> Work[list[int]]:
        lens = [r.context_len for r in reqs]
        return Work("decode", cost.decode_flops(self.cfg, lens), cost.decode_bytes(self.cfg, lens, self.dtype_bytes),
                    lambda: self.decode(reqs))

    def prefill_work(self, state: S, reqs: list[Request], start: int, end: int,
                     span: tuple[int, int] | None = None) -> Work[None]:
        """Layers [start, end) of a prefill batch; the last slice is also charged the LM head. `span`:
        a chunk's (first prompt token, tokens), attending to the cached tokens before it. Each chunk's
        last slice is charged the head's FLOPs over its tokens (the seed's convention, as the chunked
        policy prices its chunks: a chunked prompt costs the whole prompt's FLOPs), and the head's
        weights only when the chunk ends its prompt (only that one runs it)."""
        layers = end - start
        spans = [span] if span is not None else [(0, r.prompt_len) for r in reqs]
        last = end == self.cfg.num_layers
        head = last and (span is None or sum(span) == reqs[0].prompt_len)
        flops = sum(cost.prefill_layer_flops(self.cfg, n, first, layers) for first, n in spans)
        nbytes = cost.prefill_bytes(self.cfg, sum(n for _, n in spans), layers, self.dtype_bytes, head=head)
        if last:
            flops += sum(cost.prefill_head_flops(self.cfg, n) for _, n in spans)
        return Work("prefill", flops, nbytes, lambda: self.prefill_layers(state, start, end))

    def chunk_work(self, decode: list[Request], req: Request | None, n: int) -> Work[ChunkTokens]:
        """One chunked-prefill step: a decode token for each of `decode` plus `n` prompt tokens of `req`."""
        lens = [r.context_len for r in decode]
        flops = cost.decode_flops(self.cfg, lens) if decode else 0.0
        nbytes = cost.decode_bytes(self.cfg, lens, self.dtype_bytes)
        if req is not None and n:
            flops += cost.prefill_flops(self.cfg, n, req.num_cached)
            nbytes += n * self.cfg.kv_bytes_per_token(self.dtype_bytes)
        return Work("mixed", flops, nbytes, lambda: self.chunk_step(decode, req, n))


@dataclass
class SimPrefill:
    """The simulator's in-flight prefill: its requests, and a chunk's (first prompt token, tokens)."""

    reqs: list[Request]
    span: tuple[int, int] | None = None


class SimExecutor(Executor[SimPrefill]):
    """No weights: the runner's KV bookkeeping on a `BlockPool` and placeholder tokens; time comes
    from the simulated device."""

    PLACEHOLDER = 0

    def __init__(self, cfg: ModelConfig, kv_capacity_tokens: int = 1 << 20, dtype_bytes: int = 2,
                 block_size: int = 16):
        self.cfg = cfg
        self.dtype_bytes = dtype_bytes
        self.pool = BlockPool(kv_capacity_tokens, block_size)

    def admit(self, req: Request, promise: bool = True) -> None:
        self.check_request(req.prompt_len, req.params, f"request {req.id}")
        self.pool.admit(req.table, req.prompt_len, req.params.max_tokens if promise else 0, f"request {req.id}")

    def twin(self) -> SimExecutor:
        return SimExecutor(self.cfg, self.pool.capacity_tokens, self.dtype_bytes, self.pool.block_size)

    def copy_kv_from(self, src: Executor[SimPrefill], src_table: BlockTable, dst_table: BlockTable,
                     tokens: int) -> None:
        """Nothing to copy: simulated pools hold no K/V, only their count."""

    def _grow(self, reqs: list[Request]) -> None:
        self.pool.reserve_many([(r.table, r.num_cached + 1) for r in reqs], what=f"decode batch of {len(reqs)}")
        for r in reqs:
            r.num_cached += 1

    def decode(self, reqs: list[Request]) -> list[int]:
        self._grow(reqs)
        return [self.PLACEHOLDER] * len(reqs)

    def prefill_begin(self, reqs: list[Request], tokens: int | None = None) -> SimPrefill:
        return SimPrefill(list(reqs), None if tokens is None else (reqs[0].num_cached, tokens))

    def prefill_layers(self, state: SimPrefill, start: int, end: int) -> None:
        return None

    def prefill_finish(self, state: SimPrefill) -> list[int]:
        if state.span is not None and sum(state.span) < state.reqs[0].prompt_len:
            state.reqs[0].num_cached = sum(state.span)
            return []
        for r in state.reqs:
            r.num_cached = r.prompt_len
        return [self.PLACEHOLDER] * len(state.reqs)

    def chunk_step(self, decode: list[Request], req: Request | None, n: int) -> ChunkTokens:
        self._grow(decode)
        if req is None or not n:
            return [self.PLACEHOLDER] * len(decode), None
        req.num_cached += n
        return [self.PLACEHOLDER] * len(decode), (self.PLACEHOLDER if req.num_cached >= req.prompt_len else None)
