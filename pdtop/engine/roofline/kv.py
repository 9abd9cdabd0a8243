"""KV-cache arithmetic (the seed's formula) and the links that carry a KV cache between GPUs.

Every layer stores a key and a value vector per KV head for every token, so a token
needs `2 (K and V) x layers x kv_heads x head_dim x dtype_bytes` bytes and a request of
S tokens S times that: KV memory grows linearly with context. GQA and MQA shrink it by
sharing KV heads (Qwen2.5-32B: 8 KV heads, 262,144 bytes a token in BF16; with MHA's 40,
5x that). PD disaggregation sends a prompt's KV from the prefill GPU to the decode GPU
over a link; link speeds are GB/s of 10^9 bytes, one direction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pdtop.engine.errors import FieldError

# KV cache element types by name: pdtop's engine stores float32 or bfloat16; vLLM's and SGLang's
# --kv-cache-dtype add float16 and the fp8 formats (fp8 is vLLM's name for fp8_e4m3; bf16 SGLang's for
# bfloat16). Any other element size is given as its number of bytes.
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4,
                               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
DTYPE_HELP = "bfloat16 (bf16), float16 (fp16), float32, fp8 (fp8_e4m3, fp8_e5m2), or N bytes (2, 1)"

# Link bandwidths, bytes/s one direction.
LINKS: dict[str, float] = {
    "nvlink": 450e9,
    "rdma400": 50e9,
    "rdma200": 25e9,
    "rdma100": 12.5e9,
    "pcie5": 64e9,
}
LINK_HELP = ", ".join(f"{name} ({bw / 1e9:g} GB/s)" for name, bw in LINKS.items())


def _count(name: str, value: int, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token needs: 2 (K and V) x layers x KV heads x head_dim x dtype_bytes."""
    return (2 * _count("num_layers", num_layers) * _count("num_kv_heads", num_kv_heads)
            * _count("head_dim", head_dim) * _count("dtype_bytes", dtype_bytes))


def kv_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch_size: int = 1,
             dtype_bytes: int = 2) -> int:
    """Bytes of KV cache of `batch_size` requests of `seq_len` tokens (the seed's `kv_cache_bytes`)."""
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)
    return per_token * _count("seq_len", seq_len, 0) * _count("batch_size", batch_size, 0)


def requests_fit(memory_bytes: int, request_bytes: int) -> int:
    """How many whole requests of `request_bytes` of KV fit in `memory_bytes`."""
    return _count("memory_bytes", memory_bytes, 0) // _count("request_bytes", request_bytes)


def parse_dtype_bytes(text: str, field: str = "dtype") -> int:
    """A name of `DTYPE_BYTES` (`bfloat16`, `fp8`, ...) or a whole number of bytes (`2`, `1`) -> bytes
    per element; FieldError naming `field` otherwise."""
    key = text.strip().lower()
    if key in DTYPE_BYTES:
        return DTYPE_BYTES[key]
    try:
        value = int(key)
    except ValueError:
        raise FieldError(field, f"unknown dtype {text!r}; known: {DTYPE_HELP}") from None
    if value < 1:
        raise FieldError(field, f"bytes per element must be >= 1, got {text!r}")
    return value


@dataclass(frozen=True)
class Link:
    name: str  # "rdma400", or "37.5 GB/s" for a number
    bandwidth: float  # bytes/s, one direction

    @property
    def gb_s(self) -> float:
        return self.bandwidth / 1e9


def parse_link(text: str, field: str = "link") -> Link | None:
    """A known link name (case-insensitive), a number in GB/s, or `none` (no link: None);
    FieldError naming `field` otherwise."""
    key = text.strip().lower()
    if key == "none":
        return None
    if key in LINKS:
        return Link(key, LINKS[key])
    known = f"known: {LINK_HELP}, a number in GB/s, or none"
    try:
        gb_s = float(key)
    except ValueError:
        raise FieldError(field, f"unknown link {text!r}; {known}") from None
    if not (gb_s > 0 and math.isfinite(gb_s)):
        raise FieldError(field, f"a link's GB/s must be > 0, got {text!r}; {known}")
    return Link(f"{gb_s:g} GB/s", gb_s * 1e9)


def transfer_time(nbytes: float, link: Link) -> float:
    """Seconds to send `nbytes` over `link` at its bandwidth."""
    return nbytes / link.bandwidth
