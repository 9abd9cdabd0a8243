"""Decode attention from the paged KV cache in plain torch ops, capturable by a CUDA graph: the
fallback when the Triton kernel (`triton_decode.py`) cannot run, so decode graphs still replay.

A CUDA graph needs static shapes and no host syncs, so the step's blocks are laid out on the
host as one flat list of a fixed number of *entries* (`ragged_entries`): entry e is block
`blocks[e]` of decode row `rows[e]`, of which the first `counts[e]` positions are context. The
rows' blocks come first, in order; the rest of the list is padding (count 0). On the device
(`RaggedDecode.of`, once per forward) each entry becomes `block_size` slots, the cache's pad slot
past a row's context (zeros, or what a graph's pad rows wrote there), so nothing reads
uninitialised memory. Each layer then gathers the entries' K/V with `index_select`, scores each
entry against its row's query heads (GQA: a KV head's query heads are the rows of one small
matmul), and keeps a per-row online softmax in float32, merged over entries with
`scatter_reduce` (max) and `index_add_` (sums); entries go in chunks of `chunk_entries`, so the
temporaries stay under `CHUNK_BYTES`.

Cost: the list, sized for the worst case, is processed whole every step. `CudaDecoder` sizes it
per batch bucket as `min(bucket * W, pool blocks + bucket)` (W: the static table width): the
rows' blocks are distinct pool blocks and each pad row takes one, so the KV pool bounds it,
whatever the context. A step's attention thus gathers (reads, writes, then reads again) a copy
of up to a full pool's K/V per layer, padding entries re-reading the one pad slot, where the
Triton kernel reads only the batch's own context once. For the GPU check (qwen3-8b, a
131,072-token pool, 32 rows at 2,048: 8,256 entries) that is about 1.5 GB a layer against the
kernel's 0.27 GB, so a decode step of about 6.5 ms would take roughly 2.5x as long (an estimate,
not measured), in chunks of at most `CHUNK_BYTES` (256 MiB) of temporaries per layer. Slower
than the kernel, but replayed from graphs, so decode stays GPU-bound and split levels still
differ; a smaller `--kv-tokens` makes it cheaper.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CHUNK_BYTES = 256 * 2**20  # temporaries of one chunk of entries, per layer (the graph pool holds them)
_FLOOR = -1e30  # the running max before any entry: finite, so exp(max - new) never meets inf - inf


def ragged_entries(block_table: np.ndarray, context_lens: np.ndarray, block_size: int,
                   entries: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(rows, blocks, counts)`, int64 `[entries]`: every row's blocks in order (`block_table` `[n, W]`,
    `context_lens` `[n]`, each >= 1), then padding (row 0, block 0, count 0) up to `entries` (default:
    exactly the blocks needed). ValueError if the rows need more than `entries`."""
    ctx = np.asarray(context_lens, dtype=np.int64)
    per_row = (ctx + block_size - 1) // block_size
    total = int(per_row.sum())
    size = total if entries is None else entries
    if total > size:
        raise ValueError(f"the batch needs {total} KV blocks, more than the {size} entries given")
    rows = np.repeat(np.arange(len(ctx), dtype=np.int64), per_row)
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)  # block of its row
    out = np.zeros((3, size), dtype=np.int64)
    out[0, :total] = rows
    out[1, :total] = np.asarray(block_table)[rows, j]
    out[2, :total] = np.minimum(block_size, ctx[rows] - j * block_size)
    return out[0], out[1], out[2]


def chunk_entries(kv_heads: int, groups: int, head_dim: int, block_size: int, itemsize: int,
                  budget: int = CHUNK_BYTES) -> int:
    """Entries a chunk takes so that its temporaries (gathered K and V, the queries, scores and
    probabilities, the partial outputs) stay under `budget` bytes."""
    per = kv_heads * (2 * block_size * head_dim * itemsize + groups * head_dim * itemsize
                      + groups * block_size * (8 + itemsize) + groups * head_dim * (itemsize + 4))
    return max(1, budget // per)


@dataclass
class RaggedDecode:
    """One forward's entries on the device (built once, read by every layer)."""

    rows: torch.Tensor  # [P] int64: the decode row of each entry
    slots: torch.Tensor  # [P * block_size] int64: the entry's slots, the pad slot past the row's context
    masked: torch.Tensor  # [P, block_size] bool: the slots past the row's context
    num_rows: int
    block_size: int
    chunk: int  # entries per chunk (`chunk_entries`)

    @classmethod
    def of(cls, rows: torch.Tensor, blocks: torch.Tensor, counts: torch.Tensor, num_rows: int, block_size: int,
           pad_slot: int, chunk: int) -> RaggedDecode:
        offs = torch.arange(block_size, device=blocks.device)
        valid = offs[None, :] < counts[:, None]
        slots = torch.where(valid, blocks[:, None] * block_size + offs, pad_slot).reshape(-1)
        return cls(rows, slots, ~valid, num_rows, block_size, chunk)

    @classmethod
    def of_table(cls, block_table: np.ndarray, context_lens: np.ndarray, block_size: int, pad_slot: int, chunk: int,
                 device: torch.device | str, entries: int | None = None) -> RaggedDecode:
        """From host arrays (an eager step, a check): `ragged_entries` copied to `device`."""
        rows, blocks, counts = (torch.from_numpy(a).to(device) for a in
                                ragged_entries(block_table, context_lens, block_size, entries))
        return cls.of(rows, blocks, counts, len(context_lens), block_size, pad_slot, chunk)


def torch_paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rd: RaggedDecode,
                       scale: float) -> torch.Tensor:
    """q `[n, heads, d]` against k, v `[kv_heads, slots, d]` (one layer): `[n, heads, d]` in q's dtype.
    Products in the model's dtype (cuBLAS sums them in float32), softmax and sums in float32."""
    n, h, d = q.shape
    kvh, page = k.shape[0], rd.block_size
    g = h // kvh
    qg = q.view(n, kvh, g, d).transpose(0, 1)  # [kvh, n, g, d]
    m = torch.full((kvh, n, g), _FLOOR, dtype=torch.float32, device=q.device)
    l_sum = torch.zeros(kvh, n, g, dtype=torch.float32, device=q.device)
    acc = torch.zeros(kvh, n, g, d, dtype=torch.float32, device=q.device)
    total = rd.rows.shape[0]
    for s in range(0, total, rd.chunk):
        e = min(rd.chunk, total - s)
        rows = rd.rows[s:s + e]
        sl = rd.slots[s * page:(s + e) * page]
        kk = k.index_select(1, sl).view(kvh, e, page, d)
        vv = v.index_select(1, sl).view(kvh, e, page, d)
        sc = torch.matmul(qg.index_select(1, rows), kk.transpose(-1, -2)).float().mul_(scale)  # [kvh, e, g, page]
        sc.masked_fill_(rd.masked[s:s + e][None, :, None, :], float("-inf"))
        m_new = m.scatter_reduce(1, rows.view(1, e, 1).expand(kvh, e, g), sc.amax(-1), "amax")
        alpha = torch.exp(m - m_new)
        p = torch.exp(sc - m_new.index_select(1, rows)[..., None])
        l_sum.mul_(alpha).index_add_(1, rows, p.sum(-1))
        acc.mul_(alpha[..., None]).index_add_(1, rows, torch.matmul(p.to(v.dtype), vv).float())
        m = m_new
    out = acc / l_sum.clamp_min(1e-30)[..., None]  # a row with no context (a capture's warm-up): zeros
    return out.transpose(0, 1).reshape(n, h, d).to(q.dtype)
