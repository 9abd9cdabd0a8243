"""Attention on the CUDA path: decode reads the paged KV cache in place, and a chunk's attention
to its cached prefix takes one of SDPA's fused kernels, never the math one.

- Decode: `PagedDecode` holds each row's block table and context length; `attend` runs the
  Triton flash-decoding kernel (`triton_decode.py`) on one layer's cache, so decode moves
  each context token's K/V once instead of gathering a padded copy first (about 3x the
  traffic). Without Triton, `ragged` holds the same rows as one list of blocks and `attend` runs
  the torch-only path (`torch_decode.py`), which CUDA graphs capture too. `reference` is the CPU
  path's computation (gather + SDPA) for checking both.
- Prefix attention (chunked prefill: a chunk's queries see the cached prefix and, causally,
  each other): a boolean mask together with grouped K/V rules out SDPA's flash and
  memory-efficient kernels on CUDA, leaving the math one, which would make the chunked
  baseline look slower than it is. `causal_lower_right` states the same mask without
  materializing it; `prefix_mode` finds, once per shape family, the first way that runs
  with the math kernel disabled (`sdpa_kernel`): with grouped K/V ("gqa"), with K/V
  expanded to every head ("expand"), else the mask ("mask"). On the CPU the mask stays:
  torch's CPU flash kernel takes a mask with grouped K/V (3x faster than math, checked in
  tests).
"""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pdtop.engine.model.torch_decode import RaggedDecode, torch_paged_decode

MAX_SPLITS = 16


def decode_splits(rows: int, kv_heads: int, sms: int) -> int:
    """Context splits per (row, KV head): enough programs to cover the GPU twice, a power of two up
    to 16. Fixed per batch size, so a CUDA graph of that size can capture the launch."""
    want = -(-2 * sms // max(1, rows * kv_heads))
    splits = 1
    while splits < want and splits < MAX_SPLITS:
        splits *= 2
    return splits


@dataclass
class PagedDecode:
    """Where each decode row's context is in the paged cache (built by the runner)."""

    block_table: torch.Tensor  # [n, W] int32: the row's KV blocks, in order
    context_lens: torch.Tensor  # [n] int32: tokens the row attends to, its new one included (>= 1)
    block_size: int
    splits: int
    ragged: RaggedDecode | None = None  # set: the torch-only path, not the Triton kernel

    def attend(self, q: torch.Tensor, cache: torch.Tensor, scale: float) -> torch.Tensor:
        """q `[n, heads, d]` against one layer's cache `[2, kv_heads, slots, d]`: `[n, heads, d]`."""
        if self.ragged is not None:
            return torch_paged_decode(q, cache[0], cache[1], self.ragged, scale)
        return paged_decode(q, cache[0], cache[1], self.block_table, self.context_lens, self.block_size, scale,
                            self.splits)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor,
                 context_lens: torch.Tensor, block_size: int, scale: float, splits: int) -> torch.Tensor:
    """Decode attention by the Triton kernel: q `[n, h, d]`, k and v `[kv_heads, slots, d]`."""
    from pdtop.engine.model import triton_decode

    n, h, d = q.shape
    out = torch.empty(n, h, d, dtype=q.dtype, device=q.device)
    if splits > 1:
        block_d = 1 << (d - 1).bit_length()
        mid_o = torch.empty(n, h, splits, block_d, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(n, h, splits, dtype=torch.float32, device=q.device)
    else:
        mid_o = mid_lse = out  # not read with one split
    triton_decode.launch(q, k, v, block_table, context_lens, out, mid_o, mid_lse, scale, block_size, splits,
                         interpret=_interpreting())
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor,
              context_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """What `paged_decode` computes, by gathering each row's context and SDPA in float32."""
    n, h, d = q.shape
    kvh = k.shape[0]
    out = torch.empty(n, h, d, dtype=torch.float32, device=q.device)
    for row in range(n):
        pos = torch.arange(int(context_lens[row]), device=q.device)
        slots = block_table[row].long()[pos // block_size] * block_size + pos % block_size
        kk, vv = k[:, slots].float(), v[:, slots].float()
        qq = q[row].float().view(kvh, h // kvh, d)
        out[row] = F.scaled_dot_product_attention(qq, kk, vv, scale=scale).reshape(h, d)
    return out


# -- a chunk's attention to its cached prefix ------------------------------------------------

def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, scale: float) -> torch.Tensor:
    """q `[1, heads, n, d]` of the last n positions against k, v `[1, kv_heads, S, d]` (prefix + the n):
    query i sees keys 0..S-n+i. The fastest mode `prefix_mode` found for this device and shape."""
    return _prefix(prefix_mode(q.device, q.dtype, q.shape[-1], groups), q, k, v, groups, scale)


def _prefix(mode: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, scale: float) -> torch.Tensor:
    from torch.nn.attention.bias import causal_lower_right

    n, s = q.shape[-2], k.shape[-2]
    if mode == "gqa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, s), scale=scale,
                                              enable_gqa=True)
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if mode == "expand":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, s), scale=scale)
    mask = torch.arange(s, device=q.device)[None, :] <= (s - n + torch.arange(n, device=q.device))[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def fused_backends() -> list:
    """SDPA's kernels other than math (what `sdpa_kernel` should allow to show math is not taken)."""
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
    return [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]


@functools.cache
def prefix_mode(device: torch.device, dtype: torch.dtype, head_dim: int, groups: int) -> str:
    """"gqa" or "expand" if it runs on this device with SDPA's math kernel disabled and agrees with the
    float32 mask computation; "mask" otherwise (and always on the CPU). Probed once, on small inputs."""
    if device.type != "cuda":
        return "mask"
    from torch.nn.attention import sdpa_kernel

    g = torch.Generator(device=device).manual_seed(0)
    kvh, n, s = 2, 48, 112
    q = torch.randn(1, kvh * groups, n, head_dim, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(1, kvh, s, head_dim, generator=g, device=device, dtype=dtype) for _ in range(2))
    scale = head_dim ** -0.5
    want = _prefix("mask", q.float(), k.float(), v.float(), groups, scale)
    for mode in ("gqa", "expand"):
        try:
            with warnings.catch_warnings(), sdpa_kernel(fused_backends()):
                warnings.simplefilter("ignore")
                got = _prefix(mode, q, k, v, groups, scale)
        except Exception:  # no fused kernel takes this form here (or this torch lacks it)
            continue
        if torch.allclose(got.float(), want, atol=3e-2, rtol=3e-2):
            return mode
    return "mask"
