"""`ModelRunner`: the real model's executor; runs requests and returns the tokens it samples.

It implements `Executor` (`executor.py`) directly. The scheduler decides what runs and owns
what a token means: the runner never appends a token, finishes or frees a request on its own
(`prefill_finish`, `decode` and `chunk_step` return tokens; `scheduling.tokens.append_token`
takes them). The runner owns the model side of a request: its KV blocks (reserved at `admit`,
grown per step, returned by `free`), `num_cached` and its generator. Every forward's batch is
built one way (`_batch`): decode rows first, one token each, then prompt spans (whole prompts,
or a chunk attending to its cached prefix).

Thread safety: prefill (`prefill_begin/layers/finish`) may run on one thread while
`decode` runs on another, on disjoint requests. Each call builds its own batch and
activations, K/V writes go to the requests' own slots, and block allocation is
locked in the block pool. `free` refuses a request whose prefill is in flight (begun,
not finished): another request could be given its blocks while its layers still write them.

Tracing: set `layer_trace` (a `LayerTrace`) and every layer the runner runs through the
model reports its attention and MLP times, with the work they belong to ("prefill" for
`prefill_layers`, "decode" for a decode step, "mixed" for a chunked step that carries a
piece of a prompt). It is called on the thread that runs the work, so the CPU device's two
sides call it concurrently. Off (None, the default) the layers run in the untimed loop.
Decode through `CudaDecoder` (paged attention, CUDA graphs) does not report.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pdtop.engine.errors import PromptError
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.model.llama import DecodeGroup, ForwardBatch, LlamaModel, PhaseTimer, Segment
from pdtop.engine.model.sampling import greedy_tokens, make_generator, sample
from pdtop.engine.request import BlockTable, Request, RequestStatus
from pdtop.engine.runtime.cuda_graphs import CudaDecoder, DecodeInputs
from pdtop.engine.runtime.executor import ChunkTokens, Executor, LayerTrace
from pdtop.engine.runtime.kv_cache import KVCache
from pdtop.engine.runtime.kv_sizing import KvPlan

__all__ = ["ModelRunner", "PrefillState", "length_groups"]

_PREFILLABLE = (RequestStatus.WAITING, RequestStatus.PREFILLING)
Span = tuple[Request, int, int]  # prompt tokens [start, start + n) of a request: (request, start, n)


@dataclass(eq=False)
class PrefillState:
    """An in-flight prefill: packed hidden states after `next_layer` layers."""
    reqs: list[Request]
    hidden: torch.Tensor | None    # None once finished (the activations are dropped)
    batch: ForwardBatch
    last_rows: torch.Tensor        # row of each prompt's last token
    next_layer: int = 0
    logits: torch.Tensor | None = None  # [n, vocab] float32, set with the last layers
    greedy: torch.Tensor | None = None  # [n] their argmax, taken there too
    span: tuple[int, int] | None = None  # a chunk: (first prompt token, tokens) of its one request; None: whole

    @property
    def ends_prompt(self) -> bool:
        """Whether the last layers make first tokens: whole prompts, or a chunk that ends its prompt."""
        return self.span is None or sum(self.span) == self.reqs[0].prompt_len

    @property
    def tokens(self) -> int:
        return sum(r.prompt_len for r in self.reqs)


def _unfinished(state: PrefillState) -> torch.Tensor:
    """The hidden states of a prefill still in flight (ValueError for a finished one)."""
    if state.hidden is None:
        raise ValueError(f"the prefill of requests {[r.id for r in state.reqs]} is already finished")
    return state.hidden


def _tensors(state: PrefillState) -> list[torch.Tensor]:
    """The device tensors an in-flight prefill carries from one slice to the next."""
    b = state.batch
    ts = [state.hidden, state.last_rows, b.positions, b.slots, b._rope, *(s.gather for s in b.segments)]
    return [t for t in ts if t is not None]


def length_groups(lens: list[int]) -> list[list[int]]:
    """Decode rows grouped by context length, so a long context does not pad every short one.

    Rows sorted by length start a new group past twice the group's shortest length (+128):
    one group in the usual case of similar lengths, where batching all rows is cheapest.
    """
    order = sorted(range(len(lens)), key=lens.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        if groups and lens[i] <= 2 * lens[groups[-1][0]] + 128:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups



class ModelRunner(Executor[PrefillState]):
    def __init__(self, model: LlamaModel, kv_capacity_tokens: int = 8192, block_size: int = 16, *,
                 cuda_graphs: bool = True):
        """On CUDA, decode goes through `cuda_graphs.CudaDecoder` (paged attention, CUDA graphs unless
        `cuda_graphs` is False)."""
        self.model = model
        self.cfg: ModelConfig = model.config
        self.kv = KVCache(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim,
                          kv_capacity_tokens, block_size, model.dtype, model.device)
        self.pool = self.kv.pool
        self.dtype_bytes = model.dtype_bytes
        self._lock = threading.Lock()
        self._in_flight: list[PrefillState] = []
        self.cuda: CudaDecoder | None = None
        if model.device.type == "cuda":
            self.cuda = CudaDecoder(model, self.kv, graphs=cuda_graphs)

    kv_how = "as given"  # where the KV size came from (`build_engine` says)
    layer_trace: LayerTrace | None = None  # told each layer's attention and MLP times (module docstring)

    @property
    def config(self) -> ModelConfig:
        """The model's shapes: `cfg`, the executor's name for them."""
        return self.cfg

    def _timer(self, work: str) -> PhaseTimer | None:
        trace = self.layer_trace
        return None if trace is None else functools.partial(trace, work)

    def set_layer_trace(self, trace: LayerTrace | None) -> bool:
        self.layer_trace = trace
        return True

    def describe(self) -> dict[str, Any]:
        """The dtype, the KV cache's size, and on CUDA how decode runs (attention kernel, graphs)."""
        kv = KvPlan(self.pool.capacity_tokens, self.kv.bytes, self.kv_how)
        out: dict[str, Any] = {"dtype": str(self.model.dtype).removeprefix("torch."),
                               "weights": getattr(self.model, "weights", ""),  # "gguf Q4_1+Q8_0 (avx2)"
                               "kv_cache": {**kv.to_dict(), "line": kv.line()}}
        return {**out, **self.cuda.describe()} if self.cuda is not None else out

    # --- requests ----------------------------------------------------------

    def admit(self, req: Request, promise: bool = True) -> None:
        """Validate a waiting request (`check_request`, its token ids) and reserve its KV: the prompt's
        blocks now, and the promise of room for prompt + max_tokens (PromptError / KVCapacityError,
        nothing changed). Without `promise`, the prompt's blocks only (a disagg prefill instance)."""
        if req.status is not RequestStatus.WAITING or req.table.blocks or req.num_cached or req.output_ids:
            raise ValueError(f"request {req.id} is not a new waiting request")
        prompt = [int(t) for t in req.prompt_ids]
        self.check_request(len(prompt), req.params, f"request {req.id}")
        bad = next((t for t in prompt if not 0 <= t < self.cfg.vocab), None)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the vocabulary (0..{self.cfg.vocab - 1})")
        self.pool.admit(req.table, len(prompt), req.params.max_tokens if promise else 0, f"request {req.id}")
        req.prompt_ids = prompt
        req.generator = make_generator(req.params)

    def free(self, req: Request) -> None:
        """Release a request's KV blocks (idempotent); refused while its prefill is in flight."""
        with self._lock:
            if any(req in state.reqs for state in self._in_flight):
                raise ValueError(f"request {req.id}: its prefill is in flight; finish it before freeing")
        self.pool.release(req.table)

    # --- a second instance (disagg) ----------------------------------------

    def twin(self) -> ModelRunner:
        twin = ModelRunner(self.model, self.pool.capacity_tokens, self.kv.block_size, cuda_graphs=False)
        twin.kv_how = self.kv_how
        return twin

    def copy_kv_from(self, src: Executor[PrefillState], src_table: BlockTable, dst_table: BlockTable,
                     tokens: int) -> None:
        assert isinstance(src, ModelRunner)
        a, b = src.kv, self.kv
        at = torch.as_tensor(a.slots(src_table, 0, tokens), device=a.data.device)
        bt = torch.as_tensor(b.slots(dst_table, 0, tokens), device=b.data.device)
        with torch.inference_mode():  # dim 3 is the token slot: [layers, K/V, heads, slots, head_dim]
            b.data.index_copy_(3, bt, a.data.index_select(3, at).to(b.data.device))

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return sample(logits, reqs, self.cfg.eos_ids)

    def _tensor(self, values: list[int] | np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.model.device)

    # --- the one batch builder ----------------------------------------------

    def _batch(self, decode: list[Request], spans: list[Span]) -> tuple[list[int], ForwardBatch]:
        """The token ids and batch of one forward: decode rows first (each request's last token,
        attending to its cache; on CUDA read in place from the paged cache), then prompt spans, each
        attending to its request's cached prefix and causally to itself."""
        ids: list[int] = []
        pos: list[np.ndarray | list[int]] = []
        slots: list[np.ndarray] = []
        groups: list[DecodeGroup] = []
        paged = None
        if decode and self.cuda is not None and self.cuda.paged:
            inp = DecodeInputs.of(self.kv, decode)
            ids += inp.ids.tolist()
            pos.append(inp.positions)
            slots.append(inp.slots)
            paged = self.cuda.paged_batch(inp)
        elif decode:
            ids += [r.last_token for r in decode]
            d_pos = [r.num_cached for r in decode]
            tables = [r.table for r in decode]
            bs = self.kv.block_size
            pos.append(d_pos)
            slots.append(np.array([t.blocks[p // bs] * bs + p % bs for t, p in zip(tables, d_pos, strict=True)],
                                  dtype=np.int64))
            lens = [p + 1 for p in d_pos]
            rows = length_groups(lens)
            groups = [self._group(slice(None), tables, lens)] if len(rows) == 1 else [  # usual: every row, in order
                self._group(self._tensor(g), [tables[i] for i in g], [lens[i] for i in g]) for g in rows]
        segments = []
        offset = len(decode)
        for r, start, n in spans:
            ids += r.prompt_ids[start:start + n]
            pos.append(np.arange(start, start + n))
            slots.append(self.kv.slots(r.table, start, start + n))
            segments.append(self._segment(r.table, offset, start, n))
            offset += n
        return ids, ForwardBatch(kv=self.kv, positions=self._tensor(pos[0] if len(pos) == 1 else np.concatenate(pos)),
                                 slots=self._tensor(slots[0] if len(slots) == 1 else np.concatenate(slots)),
                                 num_decode=len(decode), decode_groups=groups, segments=segments, paged=paged)

    def _segment(self, table: BlockTable, offset: int, start: int, n: int) -> Segment:
        """Prompt tokens [start, start + n) at row `offset`, attending to the cached [0, start) too, causally."""
        seg = Segment(offset=offset, length=n, prefix=start)
        if start:
            seg.gather = self._tensor(self.kv.slots(table, 0, start + n))
            if self.cuda is None:  # on CUDA the causal rule needs no mask (`prefix_attention`)
                causal = np.arange(start + n)[None, :] <= (start + np.arange(n))[:, None]
                seg.mask = torch.as_tensor(causal, device=self.model.device)
        return seg

    def _group(self, rows: torch.Tensor | slice, tables: list[BlockTable], lens: list[int]) -> DecodeGroup:
        """KV slots of each row's context padded to the longest, the mask (None if none is padded) and
        the lengths (what the CPU kernel reads instead of the mask)."""
        idx, L = self.kv.gather_index(tables, lens)
        mask = None
        if min(lens) != L:
            valid = np.arange(L)[None, :] < np.asarray(lens)[:, None]
            mask = torch.as_tensor(valid, device=self.model.device)[:, None, None, :]
        cpu = self.model.device.type == "cpu"
        return DecodeGroup(rows, self._tensor(idx.reshape(-1)), L, mask, self._tensor(lens) if cpu else None)

    @staticmethod
    def _check_span(r: Request, start: int, n: int) -> None:
        """A prompt span must be the next one of an admitted request still prefilling."""
        if r.status not in _PREFILLABLE or not r.table.blocks or start != r.num_cached \
                or not 1 <= n <= r.prompt_len - start:
            raise ValueError(f"request {r.id}: no chunk of {n} tokens left to prefill after {r.num_cached} "
                             f"(admitted and prefilling: {r.status in _PREFILLABLE and bool(r.table.blocks)})")

    def _check_decoding(self, reqs: list[Request]) -> None:
        for r in reqs:
            if r.status is not RequestStatus.DECODING or r.num_cached != r.context_len - 1:
                raise ValueError(f"request {r.id} is not decoding (status {r.status.value}, {r.num_cached} of "
                                 f"{r.context_len} tokens cached: one token must be appended per step)")

    def _grow(self, reqs: list[Request]) -> None:
        """KV room for one more token of each decode row (KVCapacityError, nothing changed, if full)."""
        self.pool.reserve_many([(r.table, r.num_cached + 1) for r in reqs], what=f"decode batch of {len(reqs)}")

    # --- layer-split prefill ------------------------------------------------

    @torch.inference_mode()
    def prefill_begin(self, reqs: list[Request], tokens: int | None = None) -> PrefillState:
        """Embed whole prompts, packed; no layer has run yet. The prefill is in flight until `prefill_finish`.

        With `tokens`, one request's next chunk: its prompt tokens `[num_cached, num_cached + tokens)`,
        attending to the K/V of the chunks before it, which are cached (pdmux's chunked prefill)."""
        if not reqs:
            raise ValueError("prefill_begin needs at least one request")
        if tokens is not None and len(reqs) != 1:
            raise ValueError(f"a prefill chunk is one request's, got {len(reqs)}")
        spans = [(r, 0, r.prompt_len) for r in reqs] if tokens is None else [(reqs[0], reqs[0].num_cached, tokens)]
        for span in spans:
            self._check_span(*span)
        ids, batch = self._batch([], spans)
        last = np.cumsum([n for _, _, n in spans]) - 1
        state = PrefillState(list(reqs), self.model.embed(self._tensor(ids)), batch, self._tensor(last),
                             span=None if tokens is None else spans[0][1:])
        with self._lock:
            self._in_flight.append(state)
        return state

    @torch.inference_mode()
    def prefill_layers(self, state: PrefillState, start: int, end: int) -> None:
        """Run layers [start, end) of an in-flight prefill; layers must come in order."""
        if start != state.next_layer or not start < end <= self.cfg.num_layers:
            raise ValueError(f"prefill_layers({start}, {end}): next layer is {state.next_layer} "
                             f"of {self.cfg.num_layers}")
        hidden = _unfinished(state)
        stream = torch.cuda.current_stream(hidden.device) if hidden.is_cuda else None
        if stream is not None:  # made on another stream: not to be reused before this one is done with it
            for t in _tensors(state):
                t.record_stream(stream)
        hidden = self.model.forward_layers(hidden, state.batch, start, end, self._timer("prefill"))
        state.next_layer = end
        if end == self.cfg.num_layers and not state.ends_prompt:  # a chunk: its K/V is all it leaves
            state.hidden = None
        elif end == self.cfg.num_layers:  # final norm, LM head and argmax here, on the prefill side's units
            state.logits = self.model.logits(hidden.index_select(0, state.last_rows))
            state.greedy = greedy_tokens(state.logits)
            state.hidden = None
        else:
            state.hidden = hidden

    @torch.inference_mode()
    def prefill_finish(self, state: PrefillState) -> list[int]:
        """Each request's first token (not appended), from the logits and argmax the last layers made:
        only reading them back (and sampling rows that are not greedy) happens here. A chunk that does
        not end its prompt makes none: `[]`, its tokens counted cached."""
        if state.next_layer != self.cfg.num_layers:
            raise ValueError(f"prefill_finish after {state.next_layer} of {self.cfg.num_layers} layers")
        with self._lock:
            if state not in self._in_flight:
                raise ValueError(f"the prefill of requests {[r.id for r in state.reqs]} is already finished")
            self._in_flight.remove(state)
        if not state.ends_prompt and state.span is not None:
            state.reqs[0].num_cached = sum(state.span)
            return []
        assert state.logits is not None
        tokens = sample(state.logits, state.reqs, self.cfg.eos_ids, state.greedy)
        for r in state.reqs:
            r.num_cached = r.prompt_len
        return tokens

    def prefill_drop(self, state: PrefillState) -> None:
        """Abandon an in-flight prefill (its requests were aborted) between slices: its activations go and
        its requests may be freed. No slice of it may be running. Idempotent."""
        with self._lock:
            if state in self._in_flight:
                self._in_flight.remove(state)
        state.hidden = state.logits = state.greedy = None

    # --- decode and chunked steps ---------------------------------------------

    @torch.inference_mode()
    def next_logits(self, reqs: list[Request]) -> torch.Tensor:
        """Logits `[n, vocab]` (float32) of each decoding request's next token, batched. Writes the
        K/V of each last token but counts it nowhere (`decode` does), so it may be called again."""
        self._check_decoding(reqs)
        self._grow(reqs)
        if self.cuda is not None and self.cuda.paged:
            return self.cuda.logits(DecodeInputs.of(self.kv, reqs))
        ids, batch = self._batch(reqs, [])
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.cfg.num_layers,
                                      self._timer("decode"))
        return self.model.logits(h)

    def decode(self, reqs: list[Request]) -> list[int]:
        """One token for each request in one batched forward (KVCapacityError, nothing changed, if full);
        the tokens are returned, not appended."""
        if not reqs:
            return []
        tokens = self._sample(self.next_logits(reqs), reqs)
        for r in reqs:
            r.num_cached += 1
        return tokens

    @torch.inference_mode()
    def chunk_step(self, decode: list[Request], req: Request | None, n: int) -> ChunkTokens:
        """One forward: a decode token for each of `decode` plus the next `n` prompt tokens of `req`
        (attending to its cached prefix). Returns the decode tokens and, when this chunk ends the
        prompt, req's first token (else None)."""
        self._check_decoding(decode)
        if req is None:  # decode rows alone: the decode step (CUDA graphs on a GPU)
            return self.decode(decode), None
        if n < 1:
            raise ValueError(f"a chunk needs at least one prompt token, got {n}")
        start = req.num_cached
        n = min(n, req.prompt_len - start)
        self._check_span(req, start, n)
        if decode:
            self._grow(decode)
        ids, batch = self._batch(decode, [(req, start, n)])
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.cfg.num_layers,
                                      self._timer("mixed"))
        for r in decode:
            r.num_cached += 1
        nd = len(decode)
        rows = list(range(nd))
        sampled = list(decode)
        req.num_cached = start + n
        if req.num_cached == req.prompt_len:  # the prompt is done: its first token too
            rows.append(nd + n - 1)
            sampled.append(req)
        if not rows:
            return [], None
        tokens = self._sample(self.model.logits(h.index_select(0, self._tensor(rows))), sampled)
        return tokens[:nd], (tokens[nd] if len(tokens) > nd else None)
