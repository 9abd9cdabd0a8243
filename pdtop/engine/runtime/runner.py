"""`ModelRunner`: runs requests on the model and returns the tokens it samples.

The scheduler decides what runs and owns what a token means: the runner never
appends a token, finishes or frees a request on its own (`prefill_finish`,
`decode` and `chunk_step` return tokens; `scheduling.scheduler.append_token` takes
them). The runner owns the model side of a request: its KV blocks (reserved at
`admit`, grown per step, returned by `free`), `num_cached` and its generator.

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
from collections.abc import Callable
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
from pdtop.engine.runtime.kv_cache import KVCache
from pdtop.engine.runtime.kv_sizing import KvPlan

__all__ = ["LayerTrace", "ModelRunner", "PrefillState", "length_groups"]

_PREFILLABLE = (RequestStatus.WAITING, RequestStatus.PREFILLING)

# (work "prefill" | "decode" | "mixed", phase "attn" | "mlp", layer, start, end): `llama.PhaseTimer`
# with the work the layer ran for
LayerTrace = Callable[[str, str, int, float, float], None]


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


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_capacity_tokens: int = 8192, block_size: int = 16, *,
                 cuda_graphs: bool = True):
        """On CUDA, decode goes through `cuda_graphs.CudaDecoder` (paged attention, CUDA graphs unless
        `cuda_graphs` is False)."""
        self.model = model
        self.config: ModelConfig = model.config
        self.kv = KVCache(self.config.num_layers, self.config.num_kv_heads, self.config.head_dim,
                          kv_capacity_tokens, block_size, model.dtype, model.device)
        self.dtype_bytes = model.dtype_bytes
        self._lock = threading.Lock()
        self._in_flight: list[PrefillState] = []
        self.cuda: CudaDecoder | None = None
        if model.device.type == "cuda":
            self.cuda = CudaDecoder(model, self.kv, graphs=cuda_graphs)

    kv_how = "as given"  # where the KV size came from (`build_engine` says)
    layer_trace: LayerTrace | None = None  # told each layer's attention and MLP times (module docstring)

    def _timer(self, work: str) -> PhaseTimer | None:
        trace = self.layer_trace
        return None if trace is None else functools.partial(trace, work)

    def describe(self) -> dict[str, Any]:
        """The dtype, the KV cache's size, and on CUDA how decode runs (attention kernel, graphs)."""
        kv = KvPlan(self.kv.pool.capacity_tokens, self.kv.bytes, self.kv_how)
        out: dict[str, Any] = {"dtype": str(self.model.dtype).removeprefix("torch."),
                               "weights": getattr(self.model, "weights", ""),  # "gguf Q4_1+Q8_0 (avx2)"
                               "kv_cache": {**kv.to_dict(), "line": kv.line()}}
        return {**out, **self.cuda.describe()} if self.cuda is not None else out

    # --- requests ----------------------------------------------------------

    def admit(self, req: Request, promise: bool = True) -> None:
        """Validate a waiting request and reserve its KV: the prompt's blocks now, and the promise
        of room for prompt + max_tokens (PromptError / KVCapacityError, nothing changed). Without
        `promise`, the prompt's blocks only (a disagg prefill instance: decode holds the rest)."""
        if req.status is not RequestStatus.WAITING or req.table.blocks or req.num_cached or req.output_ids:
            raise ValueError(f"request {req.id} is not a new waiting request")
        params = req.params
        params.validate()
        prompt = [int(t) for t in req.prompt_ids]
        cfg = self.config
        if not prompt:
            raise PromptError("empty prompt: a request needs at least one token")
        bad = next((t for t in prompt if not 0 <= t < cfg.vocab), None)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the vocabulary (0..{cfg.vocab - 1})")
        if len(prompt) + params.max_tokens > cfg.max_context:
            raise PromptError(f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceeds the "
                              f"model's context of {cfg.max_context} tokens")
        self.kv.pool.admit(req.table, len(prompt), params.max_tokens if promise else 0, f"request {req.id}")
        req.prompt_ids = prompt
        req.generator = make_generator(params)

    def free(self, req: Request) -> None:
        """Release a request's KV blocks (idempotent); refused while its prefill is in flight."""
        with self._lock:
            if any(req in state.reqs for state in self._in_flight):
                raise ValueError(f"request {req.id}: its prefill is in flight; finish it before freeing")
        self.kv.pool.release(req.table)

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return sample(logits, [r.params for r in reqs], [r.generator for r in reqs])

    def _tensor(self, values: list[int] | np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.model.device)

    # --- layer-split prefill ------------------------------------------------

    @torch.inference_mode()
    def prefill_begin(self, reqs: list[Request], tokens: int | None = None) -> PrefillState:
        """Embed whole prompts, packed; no layer has run yet. The prefill is in flight until `prefill_finish`.

        With `tokens`, one request's next chunk: its prompt tokens `[num_cached, num_cached + tokens)`,
        attending to the K/V of the chunks before it, which are cached (pdmux's chunked prefill)."""
        if not reqs:
            raise ValueError("prefill_begin needs at least one request")
        if tokens is not None:
            return self._chunk_begin(reqs, tokens)
        for r in reqs:
            if r.status not in _PREFILLABLE or r.num_cached or not r.table.blocks:
                raise ValueError(f"request {r.id} is not admitted and waiting for prefill")
        ids, pos, slots, segs, last = [], [], [], [], []
        offset = 0
        for r in reqs:
            n = r.prompt_len
            ids.extend(r.prompt_ids)
            pos.append(np.arange(n))
            slots.append(self.kv.slots(r.table, 0, n))
            segs.append(Segment(offset=offset, length=n, prefix=0))
            offset += n
            last.append(offset - 1)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(np.concatenate(pos)),
                             slots=self._tensor(np.concatenate(slots)), segments=segs)
        return self._in_flight_state(PrefillState(list(reqs), self.model.embed(self._tensor(ids)), batch,
                                                  self._tensor(last)))

    def _segment(self, table: BlockTable, offset: int, start: int, n: int) -> Segment:
        """Prompt tokens [start, start + n) at row `offset`, attending to the cached [0, start) too, causally."""
        seg = Segment(offset=offset, length=n, prefix=start)
        if start:
            seg.gather = self._tensor(self.kv.slots(table, 0, start + n))
            if self.cuda is None:  # on CUDA the causal rule needs no mask (`prefix_attention`)
                causal = np.arange(start + n)[None, :] <= (start + np.arange(n))[:, None]
                seg.mask = torch.as_tensor(causal, device=self.model.device)
        return seg

    def _in_flight_state(self, state: PrefillState) -> PrefillState:
        with self._lock:
            self._in_flight.append(state)
        return state

    def _chunk_begin(self, reqs: list[Request], tokens: int) -> PrefillState:
        if len(reqs) != 1:
            raise ValueError(f"a prefill chunk is one request's, got {len(reqs)}")
        r = reqs[0]
        start = r.num_cached
        if r.status not in _PREFILLABLE or not r.table.blocks or not 1 <= tokens <= r.prompt_len - start:
            raise ValueError(f"request {r.id}: no chunk of {tokens} tokens left to prefill after {start}")
        seg = self._segment(r.table, 0, start, tokens)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(np.arange(start, start + tokens)),
                             slots=self._tensor(self.kv.slots(r.table, start, start + tokens)), segments=[seg])
        hidden = self.model.embed(self._tensor(r.prompt_ids[start:start + tokens]))
        return self._in_flight_state(PrefillState([r], hidden, batch, self._tensor([tokens - 1]),
                                                  span=(start, tokens)))

    @torch.inference_mode()
    def prefill_layers(self, state: PrefillState, start: int, end: int) -> None:
        """Run layers [start, end) of an in-flight prefill; layers must come in order."""
        if start != state.next_layer or not start < end <= self.config.num_layers:
            raise ValueError(f"prefill_layers({start}, {end}): next layer is {state.next_layer} "
                             f"of {self.config.num_layers}")
        hidden = _unfinished(state)
        stream = torch.cuda.current_stream(hidden.device) if hidden.is_cuda else None
        if stream is not None:  # made on another stream: not to be reused before this one is done with it
            for t in _tensors(state):
                t.record_stream(stream)
        hidden = self.model.forward_layers(hidden, state.batch, start, end, self._timer("prefill"))
        state.next_layer = end
        if end == self.config.num_layers and not state.ends_prompt:  # a chunk: its K/V is all it leaves
            state.hidden = None
        elif end == self.config.num_layers:  # final norm, LM head and argmax here, on the prefill side's units
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
        if state.next_layer != self.config.num_layers:
            raise ValueError(f"prefill_finish after {state.next_layer} of {self.config.num_layers} layers")
        with self._lock:
            if state not in self._in_flight:
                raise ValueError(f"the prefill of requests {[r.id for r in state.reqs]} is already finished")
            self._in_flight.remove(state)
        if not state.ends_prompt and state.span is not None:
            state.reqs[0].num_cached = sum(state.span)
            return []
        assert state.logits is not None
        tokens = sample(state.logits, [r.params for r in state.reqs], [r.generator for r in state.reqs], state.greedy)
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

    def prefill(self, reqs: list[Request]) -> list[int]:
        """Whole prefill in one call."""
        self.prefill_layers(state := self.prefill_begin(reqs), 0, self.config.num_layers)
        return self.prefill_finish(state)

    # --- decode and chunked steps ---------------------------------------------

    def _check_decoding(self, reqs: list[Request]) -> None:
        for r in reqs:
            if r.status is not RequestStatus.DECODING or r.num_cached != r.context_len - 1:
                raise ValueError(f"request {r.id} is not decoding (status {r.status.value}, {r.num_cached} of "
                                 f"{r.context_len} tokens cached: one token must be appended per step)")

    def _grow(self, reqs: list[Request]) -> None:
        """KV room for one more token of each decode row (KVCapacityError, nothing changed, if full)."""
        self.kv.pool.reserve_many([(r.table, r.num_cached + 1) for r in reqs], what=f"decode batch of {len(reqs)}")

    def _decode_batch(self, reqs: list[Request]) -> tuple[list[int], list[int], np.ndarray, list[DecodeGroup]]:
        """Ids, positions, slots of the decode rows and their groups (what each row attends to)."""
        ids = [r.last_token for r in reqs]
        pos = [r.num_cached for r in reqs]
        lens = [p + 1 for p in pos]
        tables = [r.table for r in reqs]
        bs = self.kv.block_size
        slots = np.array([t.blocks[p // bs] * bs + p % bs for t, p in zip(tables, pos, strict=True)], dtype=np.int64)
        groups = length_groups(lens)
        if len(groups) == 1:  # the usual case: every row, in batch order
            return ids, pos, slots, [self._group(slice(None), tables, lens)]
        decode_groups = [self._group(self._tensor(rows), [tables[i] for i in rows], [lens[i] for i in rows])
                         for rows in groups]
        return ids, pos, slots, decode_groups

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

    @torch.inference_mode()
    def next_logits(self, reqs: list[Request]) -> torch.Tensor:
        """Logits `[n, vocab]` (float32) of each decoding request's next token, batched. Writes the
        K/V of each last token but counts it nowhere (`decode` does), so it may be called again."""
        self._check_decoding(reqs)
        self._grow(reqs)
        if self.cuda is not None and self.cuda.paged:
            return self.cuda.logits(DecodeInputs.of(self.kv, reqs))
        ids, pos, slots, groups = self._decode_batch(reqs)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(pos), slots=self._tensor(slots),
                             num_decode=len(reqs), decode_groups=groups)
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.config.num_layers,
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
    def chunk_step(self, decode_reqs: list[Request], chunk_req: Request | None,
                   chunk_tokens: int) -> tuple[list[int], int | None]:
        """One forward: a decode token for each of `decode_reqs` plus the next `chunk_tokens` prompt
        tokens of `chunk_req` (attending to its cached prefix). Returns the decode tokens and, when
        this chunk ends the prompt, chunk_req's first token (else None)."""
        self._check_decoding(decode_reqs)
        n = start = 0  # the prompt piece this step carries: tokens [start, start + n) of chunk_req
        if chunk_req is not None:
            if chunk_req.status not in _PREFILLABLE or not chunk_req.table.blocks \
                    or chunk_req.num_cached >= chunk_req.prompt_len:
                raise ValueError(f"request {chunk_req.id} has no prompt left to prefill")
            if chunk_tokens < 1:
                raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
            start = chunk_req.num_cached
            n = min(chunk_tokens, chunk_req.prompt_len - start)
        else:  # decode rows alone: the decode step (CUDA graphs on a GPU)
            return self.decode(decode_reqs), None
        ids: list[int] = []
        pos: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        groups: list[DecodeGroup] = []
        paged = None
        if decode_reqs:
            self._grow(decode_reqs)
            if self.cuda is not None and self.cuda.paged:
                inp = DecodeInputs.of(self.kv, decode_reqs)
                ids += inp.ids.tolist()
                pos.append(inp.positions)
                slots.append(inp.slots)
                paged = self.cuda.paged_batch(inp)
            else:
                d_ids, d_pos, d_slots, groups = self._decode_batch(decode_reqs)
                ids += d_ids
                pos.append(np.asarray(d_pos, dtype=np.int64))
                slots.append(d_slots)
        segments = []
        if chunk_req is not None:
            ids += chunk_req.prompt_ids[start:start + n]
            pos.append(np.arange(start, start + n))
            slots.append(self.kv.slots(chunk_req.table, start, start + n))
            segments.append(self._segment(chunk_req.table, len(decode_reqs), start, n))
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(np.concatenate(pos)),
                             slots=self._tensor(np.concatenate(slots)), num_decode=len(decode_reqs),
                             decode_groups=groups, segments=segments, paged=paged)
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.config.num_layers,
                                      self._timer("mixed"))
        for r in decode_reqs:
            r.num_cached += 1
        nd = len(decode_reqs)
        rows = list(range(nd))
        sampled = list(decode_reqs)
        if chunk_req is not None:
            chunk_req.num_cached = start + n
            if chunk_req.num_cached == chunk_req.prompt_len:  # the prompt is done: its first token too
                rows.append(nd + n - 1)
                sampled.append(chunk_req)
        if not rows:
            return [], None
        tokens = self._sample(self.model.logits(h.index_select(0, self._tensor(rows))), sampled)
        return tokens[:nd], (tokens[nd] if len(tokens) > nd else None)
