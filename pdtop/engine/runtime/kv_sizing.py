"""How many tokens the KV cache holds: a fixed count, or sized from free GPU memory.

On a GPU the cache takes what is left of a fraction of the device's memory once the
weights are loaded, as vLLM's `--gpu-memory-utilization` does: `fraction * total -
(total - free) - reserve`, where `reserve` is kept for activations (the largest
prefill batch), the chunked baseline's prefix gather and the decode graphs' pool.
`--kv-tokens N` asks for an exact size instead, refused up front if it does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.errors import EngineError
from pdtop.engine.model.config import ModelConfig

GiB = 1 << 30
DEFAULT_GPU_MEMORY_FRACTION = 0.9
CPU_KV_TOKENS = 16384  # the CPU device's default cache
GRAPH_POOL_GUESS = 256 << 20  # decode graphs share one pool; measured and reported after capture
SAFETY = 1 << 30  # cuBLAS workspaces, allocator fragmentation


@dataclass(frozen=True)
class KvPlan:
    tokens: int
    bytes: int
    how: str  # where the size came from, for the one line the commands print

    def line(self) -> str:
        return f"KV cache: {self.tokens:,} tokens ({self.bytes / GiB:.1f} GiB), {self.how}"

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "bytes": self.bytes, "how": self.how}


def activation_reserve(cfg: ModelConfig, dtype_bytes: int, prefill_tokens: int) -> int:
    """Bytes kept free beside the cache: a `prefill_tokens` forward's live activations (q/k/v, the
    MLP's gate/up in the model dtype; the residual stream and its sum, and the norms' work, in float32
    whatever the dtype: `model/llama.py`), one layer's gathered prefix K/V at full context (the
    chunked baseline's), the graphs' pool and a safety margin."""
    act = prefill_tokens * ((4 * cfg.hidden + 3 * cfg.ffn) * dtype_bytes + 4 * 4 * cfg.hidden)
    prefix = 2 * cfg.num_heads * cfg.max_context * cfg.head_dim * dtype_bytes
    return act + prefix + GRAPH_POOL_GUESS + SAFETY


def plan_kv(per_token: int, free: int, total: int, reserve: int, *, fraction: float | None = None,
            tokens: int | None = None, block_size: int = 16) -> KvPlan:
    """The cache size for a GPU with `free` of `total` bytes free (weights already loaded).

    `tokens` asks for an exact count (EngineError if it needs more than is free beside
    `reserve`); otherwise `fraction` (default 0.9) of all memory is the limit for everything
    pdtop holds, and the cache gets what is left, in whole blocks.
    """
    if tokens is not None:
        if tokens < 1:
            raise EngineError(f"--kv-tokens must be >= 1, got {tokens}")
        need = tokens * per_token
        room = free - reserve
        if need > room:
            raise EngineError(f"--kv-tokens {tokens:,} needs {need / GiB:.1f} GiB; only {max(room, 0) / GiB:.1f} "
                              f"GiB is free beside the weights and {reserve / GiB:.1f} GiB kept for activations")
        return KvPlan(tokens, need, "as --kv-tokens asked")
    fraction = DEFAULT_GPU_MEMORY_FRACTION if fraction is None else fraction
    if not 0 < fraction <= 1:
        raise EngineError(f"--gpu-memory-fraction must be in (0, 1], got {fraction:g}")
    budget = min(int(fraction * total) - (total - free), free) - reserve
    count = max(0, budget) // per_token // block_size * block_size
    if count < block_size:
        raise EngineError(f"no room for a KV cache: {fraction:g} of {total / GiB:.1f} GiB is "
                          f"{fraction * total / GiB:.1f} GiB, {(total - free) / GiB:.1f} GiB is in use and "
                          f"{reserve / GiB:.1f} GiB is kept for activations; raise --gpu-memory-fraction or use a "
                          "smaller model")
    return KvPlan(count, count * per_token, f"{fraction:g} of {total / GiB:.1f} GiB GPU memory")
