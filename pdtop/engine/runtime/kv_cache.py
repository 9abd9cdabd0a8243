"""A paged KV cache of fixed token capacity, shared by every running sequence.

The storage is one tensor per layer, `[2 (K, V), kv_heads, slots + 1, head_dim]`
(head-major, so a gather yields the `[heads, tokens, dim]` rows attention reads, and
one index op moves K and V together), cut into blocks of `block_size` token slots; each sequence owns a `BlockTable`
(its block ids in order), so token `i` of a sequence lives in slot
`blocks[i // block_size] * block_size + i % block_size`. The extra last slot is
all zeros: padded positions of a decode batch point there, so masked-out rows
never read uninitialised memory. Allocation and release take a lock (the decode
and prefill threads both grow tables); a failed reservation changes nothing.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from pdtop.engine.errors import KVCapacityError


@dataclass
class BlockTable:
    """One sequence's blocks and how many token slots it has reserved."""
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity_tokens: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_tokens < block_size:
            raise ValueError(f"KV capacity must be at least one block ({block_size} tokens), got {capacity_tokens}")
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.num_layers = num_layers
        slots = self.num_blocks * block_size
        self.pad_slot = slots
        # torch.empty: pages are only touched when written; the pad slot is zeroed.
        self.data = torch.empty(num_layers, 2, num_kv_heads, slots + 1, head_dim, dtype=dtype, device=device)
        self.data[:, :, :, slots].zero_()
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._used_tokens = 0
        self._lock = threading.Lock()

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def used_tokens(self) -> int:
        """Token slots reserved by live sequences."""
        return self._used_tokens

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

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

    def blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        have = len(table.blocks)
        return max(0, -(-num_tokens // self.block_size) - have)

    def reserve(self, table: BlockTable, num_tokens: int, what: str = "sequence") -> None:
        """Grow `table` to hold `num_tokens` tokens; KVCapacityError (and no change) if full."""
        self.reserve_many([(table, num_tokens)], what)

    def reserve_many(self, wants: list[tuple[BlockTable, int]], what: str = "batch") -> None:
        """Grow several tables at once, all or nothing."""
        with self._lock:
            need = sum(self.blocks_needed(t, n) for t, n in wants)
            if need > len(self._free):
                raise KVCapacityError(
                    f"KV cache full: {what} needs {need} more blocks of {self.block_size} tokens, "
                    f"{len(self._free)} of {self.num_blocks} free ({self._used_tokens}/{self.capacity_tokens} "
                    "tokens in use)")
            for t, n in wants:
                for _ in range(self.blocks_needed(t, n)):
                    t.blocks.append(self._free.pop())
                if n > t.num_tokens:
                    self._used_tokens += n - t.num_tokens
                    t.num_tokens = n

    def release(self, table: BlockTable) -> None:
        """Return a table's blocks to the pool (idempotent)."""
        with self._lock:
            self._free.extend(reversed(table.blocks))
            self._used_tokens -= table.num_tokens
            table.blocks = []
            table.num_tokens = 0

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
