"""`ModelRunner`: sequences, batched decode, layer-split prefill and chunked steps.

The scheduler decides what runs; the runner runs it. Thread safety: prefill
(`prefill_begin/layers/finish`) may run on one thread while `decode` runs on
another, on disjoint sequences. Each call builds its own batch and activations,
K/V writes go to the sequences' own slots, and block allocation is locked in
the KV cache. A sequence's KV blocks are released as soon as it finishes
(`free` is idempotent, for requests dropped early).
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from pdtop.engine.model.config import ModelConfig
from pdtop.engine.errors import PromptError
from pdtop.engine.runtime.kv_cache import BlockTable, KVCache
from pdtop.engine.model.llama import DecodeGroup, ForwardBatch, LlamaModel, Segment
from pdtop.engine.model.sampling import SamplingParams, make_generator, sample

__all__ = ["ModelRunner", "PrefillState", "SamplingParams", "Sequence"]


@dataclass(eq=False)
class Sequence:
    """One request's state. `num_cached`: tokens whose K/V is in the cache."""
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    finished: bool = False
    finish_reason: str | None = None  # "eos" | "length"
    table: BlockTable = field(default_factory=BlockTable, repr=False)
    generator: torch.Generator | None = field(default=None, repr=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilled(self) -> bool:
        return bool(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]


@dataclass(eq=False)
class PrefillState:
    """An in-flight prefill: packed hidden states after `next_layer` layers."""
    seqs: list[Sequence]
    hidden: torch.Tensor | None
    batch: ForwardBatch
    last_rows: torch.Tensor        # row of each prompt's last token
    next_layer: int = 0
    logits: torch.Tensor | None = None  # [n, vocab] float32, set by prefill_finish

    @property
    def tokens(self) -> int:
        return sum(s.prompt_len for s in self.seqs)


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
    def __init__(self, model: LlamaModel, kv_capacity_tokens: int = 8192, block_size: int = 16):
        self.model = model
        self.config: ModelConfig = model.config
        self.kv = KVCache(self.config.num_layers, self.config.num_kv_heads, self.config.head_dim,
                          kv_capacity_tokens, block_size, model.dtype, model.device)
        self.dtype_bytes = model.dtype_bytes
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._eos = frozenset(self.config.eos_ids)

    # --- sequences -------------------------------------------------------

    def add_sequence(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Sequence:
        """Validate a request and reserve KV for its prompt (PromptError / KVCapacityError, nothing changed)."""
        params = params or SamplingParams()
        params.validate()
        prompt = [int(t) for t in prompt_ids]
        cfg = self.config
        if not prompt:
            raise PromptError("empty prompt: a request needs at least one token")
        bad = next((t for t in prompt if not 0 <= t < cfg.vocab), None)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the vocabulary (0..{cfg.vocab - 1})")
        if len(prompt) + params.max_tokens > cfg.max_context:
            raise PromptError(f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceeds the "
                              f"model's context of {cfg.max_context} tokens")
        with self._lock:
            seq_id = next(self._ids)
        seq = Sequence(seq_id, prompt, params, generator=make_generator(params))
        self.kv.reserve(seq.table, len(prompt), what=f"request {seq_id} ({len(prompt)}-token prompt)")
        return seq

    def free(self, seq: Sequence) -> None:
        """Release a sequence's KV blocks (idempotent)."""
        self.kv.release(seq.table)

    def _append(self, seq: Sequence, token: int) -> None:
        seq.output_ids.append(token)
        if token in self._eos and not seq.params.ignore_eos:
            seq.finished, seq.finish_reason = True, "eos"
        elif len(seq.output_ids) >= seq.params.max_tokens:
            seq.finished, seq.finish_reason = True, "length"
        if seq.finished:
            self.free(seq)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        return sample(logits, [s.params for s in seqs], [s.generator for s in seqs])

    def _tensor(self, values: list[int] | np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.model.device)

    # --- layer-split prefill ------------------------------------------------

    @torch.inference_mode()
    def prefill_begin(self, seqs: list[Sequence]) -> PrefillState:
        """Embed whole prompts, packed; no layer has run yet."""
        if not seqs:
            raise ValueError("prefill_begin needs at least one sequence")
        for s in seqs:
            if s.finished or s.num_cached or s.prefilled:
                raise ValueError(f"sequence {s.id} is not waiting for prefill")
        ids, pos, slots, segs, last = [], [], [], [], []
        offset = 0
        for s in seqs:
            n = s.prompt_len
            ids.extend(s.prompt_ids)
            pos.append(np.arange(n))
            slots.append(self.kv.slots(s.table, 0, n))
            segs.append(Segment(offset=offset, length=n, prefix=0))
            offset += n
            last.append(offset - 1)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(np.concatenate(pos)),
                             slots=self._tensor(np.concatenate(slots)), segments=segs)
        hidden = self.model.embed(self._tensor(ids))
        return PrefillState(list(seqs), hidden, batch, self._tensor(last))

    @torch.inference_mode()
    def prefill_layers(self, state: PrefillState, start: int, end: int) -> None:
        """Run layers [start, end) of an in-flight prefill; layers must come in order."""
        if start != state.next_layer or not start < end <= self.config.num_layers:
            raise ValueError(f"prefill_layers({start}, {end}): next layer is {state.next_layer} "
                             f"of {self.config.num_layers}")
        state.hidden = self.model.forward_layers(state.hidden, state.batch, start, end)
        state.next_layer = end

    @torch.inference_mode()
    def prefill_finish(self, state: PrefillState) -> list[int]:
        """Final norm + logits at each prompt's last token; samples and appends each first token."""
        if state.next_layer != self.config.num_layers:
            raise ValueError(f"prefill_finish after {state.next_layer} of {self.config.num_layers} layers")
        logits = self.model.logits(state.hidden.index_select(0, state.last_rows))
        state.hidden, state.logits = None, logits
        tokens = self._sample(logits, state.seqs)
        for s, t in zip(state.seqs, tokens):
            s.num_cached = s.prompt_len
            self._append(s, t)
        return tokens

    def prefill(self, seqs: list[Sequence]) -> list[int]:
        """Whole prefill in one call."""
        state = self.prefill_begin(seqs)
        self.prefill_layers(state, 0, self.config.num_layers)
        return self.prefill_finish(state)

    # --- decode and chunked steps ---------------------------------------------

    def _check_decoding(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if s.finished or not s.prefilled:
                raise ValueError(f"sequence {s.id} is not decoding (finished={s.finished}, "
                                 f"prefilled={s.prefilled})")

    def _decode_batch(self, seqs: list[Sequence], extra_slots: int = 0) -> tuple[list[int], list[int], np.ndarray,
                                                                                  dict]:
        """Ids, positions, slots of the decode rows and the gather/mask fields of a ForwardBatch."""
        ids = [s.last_token for s in seqs]
        pos = [s.num_cached for s in seqs]
        lens = [p + 1 for p in pos]
        tables = [s.table for s in seqs]
        bs = self.kv.block_size
        slots = np.array([t.blocks[p // bs] * bs + p % bs for t, p in zip(tables, pos)], dtype=np.int64)
        groups = length_groups(lens)
        if len(groups) == 1:
            idx, L, mask = self._gather(tables, lens)
            fields = dict(num_decode=len(seqs), decode_gather=idx, decode_len=L, decode_mask=mask)
        else:
            decode_groups = []
            for rows in groups:
                idx, L, mask = self._gather([tables[i] for i in rows], [lens[i] for i in rows])
                decode_groups.append(DecodeGroup(self._tensor(rows), idx, L, mask))
            fields = dict(num_decode=len(seqs), decode_groups=decode_groups)
        return ids, pos, slots, fields

    def _gather(self, tables: list, lens: list[int]) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """KV slots of each row's context padded to the longest, and the mask (None if none is padded)."""
        idx, L = self.kv.gather_index(tables, lens)
        mask = None
        if min(lens) != L:
            valid = np.arange(L)[None, :] < np.asarray(lens)[:, None]
            mask = torch.as_tensor(valid, device=self.model.device)[:, None, None, :]
        return self._tensor(idx.reshape(-1)), L, mask

    @torch.inference_mode()
    def next_logits(self, seqs: list[Sequence]) -> torch.Tensor:
        """Logits `[n, vocab]` (float32) of each decoding sequence's next token, batched; appends nothing."""
        self._check_decoding(seqs)
        self.kv.reserve_many([(s.table, s.num_cached + 1) for s in seqs], what=f"decode batch of {len(seqs)}")
        ids, pos, slots, fields = self._decode_batch(seqs)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(pos), slots=self._tensor(slots), **fields)
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.config.num_layers)
        return self.model.logits(h)

    def decode(self, seqs: list[Sequence]) -> list[int]:
        """One token for each sequence in one batched forward (KVCapacityError, nothing changed, if full)."""
        if not seqs:
            return []
        logits = self.next_logits(seqs)
        tokens = self._sample(logits, seqs)
        for s, t in zip(seqs, tokens):
            s.num_cached += 1
            self._append(s, t)
        return tokens

    @torch.inference_mode()
    def chunk_step(self, decode_seqs: list[Sequence], chunk_seq: Sequence | None,
                   chunk_tokens: int) -> tuple[list[int], int | None]:
        """One forward: a decode token for each of `decode_seqs` plus the next `chunk_tokens` prompt
        tokens of `chunk_seq` (attending to its cached prefix). Returns the decode tokens and, when
        this chunk ends the prompt, chunk_seq's first token (else None)."""
        self._check_decoding(decode_seqs)
        n = start = 0
        if chunk_seq is not None:
            if chunk_seq.finished or chunk_seq.prefilled:
                raise ValueError(f"sequence {chunk_seq.id} has no prompt left to prefill")
            if chunk_tokens < 1:
                raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
            start = chunk_seq.num_cached
            n = min(chunk_tokens, chunk_seq.prompt_len - start)
        if not decode_seqs and not n:
            return [], None
        ids: list[int] = []
        pos: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        fields: dict = {}
        if decode_seqs:
            self.kv.reserve_many([(s.table, s.num_cached + 1) for s in decode_seqs],
                                 what=f"decode batch of {len(decode_seqs)}")
            d_ids, d_pos, d_slots, fields = self._decode_batch(decode_seqs)
            ids += d_ids
            pos.append(np.asarray(d_pos, dtype=np.int64))
            slots.append(d_slots)
        segments = []
        if n:
            ids += chunk_seq.prompt_ids[start:start + n]
            pos.append(np.arange(start, start + n))
            slots.append(self.kv.slots(chunk_seq.table, start, start + n))
            seg = Segment(offset=len(decode_seqs), length=n, prefix=start)
            if start:
                seg.gather = self._tensor(self.kv.slots(chunk_seq.table, 0, start + n))
                causal = np.arange(start + n)[None, :] <= (start + np.arange(n))[:, None]
                seg.mask = torch.as_tensor(causal, device=self.model.device)
            segments.append(seg)
        batch = ForwardBatch(kv=self.kv, positions=self._tensor(np.concatenate(pos)),
                             slots=self._tensor(np.concatenate(slots)), segments=segments, **fields)
        h = self.model.forward_layers(self.model.embed(self._tensor(ids)), batch, 0, self.config.num_layers)
        nd = len(decode_seqs)
        done = n and start + n == chunk_seq.prompt_len
        rows = list(range(nd)) + ([nd + n - 1] if done else [])
        if not rows:
            chunk_seq.num_cached = start + n
            return [], None
        logits = self.model.logits(h.index_select(0, self._tensor(rows)))
        seqs = decode_seqs + ([chunk_seq] if done else [])
        tokens = self._sample(logits, seqs)
        for s, t in zip(decode_seqs, tokens):
            s.num_cached += 1
            self._append(s, t)
        first = None
        if n:
            chunk_seq.num_cached = start + n
            if done:
                first = tokens[-1]
                self._append(chunk_seq, first)
        return tokens[:nd], first
