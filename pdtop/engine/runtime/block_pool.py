"""KV block accounting: which blocks each request holds, and what admission promised it.

The one place KV reservation is counted, for every device: the real `KVCache` keeps
its tensors beside a `BlockPool`, the simulator's executor has a `BlockPool` alone.
A request's `BlockTable` (defined with the request, `engine/request.py`, and importable
from here) lists its block ids in order, so token `i` lives in slot
`blocks[i // block_size] * block_size + i % block_size`.

Admission (`admit`) takes the prompt's blocks and promises the request room for
its prompt + max_tokens: promised blocks are counted as
committed, so later growth within a promise can never fail, and a request whose
promise does not fit waits instead of running out of KV mid-decode (as nano-vllm's
block manager and SGLang's admission do). Growth past a promise takes free blocks
that nobody was promised, or fails (KVCapacityError, nothing changed). The pool
takes a lock: the decode and prefill threads both grow tables. Pure Python, no
torch, so the simulator stays light.
"""
from __future__ import annotations

import threading

from pdtop.engine.errors import KVCapacityError, PromptError
from pdtop.engine.request import BlockTable

__all__ = ["BlockPool", "BlockTable"]


class BlockPool:
    def __init__(self, capacity_tokens: int, block_size: int = 16):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_tokens < block_size:
            raise ValueError(f"KV capacity must be at least one block ({block_size} tokens), got {capacity_tokens}")
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._used_tokens = 0
        self._committed = 0  # blocks held or promised: sum of max(len(blocks), promised_blocks)
        self._lock = threading.Lock()

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def used_tokens(self) -> int:
        """Token slots reserved by live requests."""
        return self._used_tokens

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def committed_blocks(self) -> int:
        """Blocks held or promised to live requests (what admission checks against)."""
        return self._committed

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int, what: str = "request") -> None:
        """PromptError if a prompt and `max_new_tokens` more need more than the whole cache (waiting
        for room would be forever)."""
        need = prompt_tokens + max_new_tokens
        if self.blocks_for(need) > self.num_blocks:
            raise PromptError(f"KV cache too small: {what} ({prompt_tokens}-token prompt + max_tokens "
                              f"{max_new_tokens}) needs {need} tokens, the whole cache holds {self.capacity_tokens}")

    def admit(self, table: BlockTable, prompt_tokens: int, max_new_tokens: int, what: str = "request") -> None:
        """Hold the prompt's blocks and promise room for `max_new_tokens` more: KVCapacityError (and
        no change) if that does not fit now, PromptError if it never can (`check_fits`)."""
        self.check_fits(prompt_tokens, max_new_tokens, what)
        need = prompt_tokens + max_new_tokens
        self._grow([(table, prompt_tokens, self.blocks_for(need))],
                   f"{what} ({prompt_tokens}-token prompt + max_tokens {max_new_tokens})")

    def reserve_many(self, wants: list[tuple[BlockTable, int]], what: str = "batch") -> None:
        """Grow several tables at once, all or nothing."""
        self._grow([(t, n, 0) for t, n in wants], what)

    def _grow(self, wants: list[tuple[BlockTable, int, int]], what: str) -> None:
        with self._lock:
            grow = commit = 0
            for t, n, promise in wants:
                blocks = max(len(t.blocks), self.blocks_for(n))
                grow += blocks - len(t.blocks)
                commit += max(blocks, promise, t.promised_blocks) - max(len(t.blocks), t.promised_blocks)
            if self._committed + commit > self.num_blocks or grow > len(self._free):
                raise KVCapacityError(
                    f"KV cache full: {what} needs {max(grow, commit)} more blocks of {self.block_size} tokens, "
                    f"{self.num_blocks - self._committed} of {self.num_blocks} neither held nor promised "
                    f"({self._used_tokens}/{self.capacity_tokens} tokens in use)")
            self._committed += commit
            for t, n, promise in wants:
                t.promised_blocks = max(t.promised_blocks, promise)
                for _ in range(self.blocks_for(n) - len(t.blocks)):
                    t.blocks.append(self._free.pop())
                if n > t.num_tokens:
                    self._used_tokens += n - t.num_tokens
                    t.num_tokens = n

    def release(self, table: BlockTable) -> None:
        """Return a table's blocks and promise to the pool (idempotent)."""
        with self._lock:
            self._committed -= max(len(table.blocks), table.promised_blocks)
            self._free.extend(reversed(table.blocks))
            self._used_tokens -= table.num_tokens
            table.blocks, table.num_tokens, table.promised_blocks = [], 0, 0
