"""A paged KV cache of fixed token capacity, shared by every running request.

The storage is one tensor per layer, `[2 (K, V), kv_heads, slots + 1, head_dim]`
(head-major, so a gather yields the `[heads, tokens, dim]` rows attention reads, and
one index op moves K and V together), cut into blocks of `block_size` token slots.
Which blocks each request holds is counted by `pool` (a `BlockPool`, shared with the
simulator's accounting), so token `i` of a request lives in slot
`blocks[i // block_size] * block_size + i % block_size`. The extra last slot is
all zeros: padded positions of a decode batch point there, so masked-out rows
never read uninitialised memory.
"""
from __future__ import annotations

import numpy as np
import torch

from pdtop.engine.request import BlockTable
from pdtop.engine.runtime.block_pool import BlockPool


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity_tokens: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.pool = BlockPool(capacity_tokens, block_size)
        self.block_size = block_size
        self.num_layers = num_layers
        slots = self.pool.capacity_tokens
        self.pad_slot = slots
        # torch.empty: pages are only touched when written; the pad slot is zeroed.
        self.data = torch.empty(num_layers, 2, num_kv_heads, slots + 1, head_dim, dtype=dtype, device=device)
        self.data[:, :, :, slots].zero_()

    @property
    def bytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def k(self) -> torch.Tensor:
        """`[layers, kv_heads, slots + 1, head_dim]` view of the keys."""
        return self.data[:, 0]

    @property
    def v(self) -> torch.Tensor:
        return self.data[:, 1]

    def layer(self, i: int) -> torch.Tensor:
        """`[2, kv_heads, slots + 1, head_dim]`: layer i's keys and values."""
        return self.data[i]

    def slots(self, table: BlockTable, start: int, end: int) -> np.ndarray:
        """Slots of token positions [start, end) of a sequence (int64)."""
        pos = np.arange(start, end)
        blocks = np.asarray(table.blocks, dtype=np.int64)
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def gather_index(self, tables: list[BlockTable], lengths: list[int]) -> tuple[np.ndarray, int]:
        """`[n, L]` slots of the first `lengths[i]` tokens of each table, padded with `pad_slot`; and L."""
        n, L, bs = len(tables), max(lengths), self.block_size
        nb = -(-L // bs)
        bt = np.full((n, nb), -1, dtype=np.int64)
        for i, t in enumerate(tables):
            k = min(nb, len(t.blocks))
            bt[i, :k] = t.blocks[:k]
        idx = (bt[:, :, None] * bs + np.arange(bs)).reshape(n, nb * bs)[:, :L]
        valid = np.arange(L)[None, :] < np.asarray(lengths)[:, None]
        return np.where(valid, idx, self.pad_slot), L
