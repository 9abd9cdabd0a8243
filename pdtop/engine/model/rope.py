"""RoPE frequencies, with the context-stretching schemes of HF's `rope_scaling`.

The model rotates adjacent pairs (2i, 2i + 1) of each head by `position * inv_freq[i]`
(llama.cpp's "normal" RoPE, one complex multiply; see `llama.rope_`). Checkpoints made
for rotate-half RoPE (pairs (i, i + d/2): HF, and llama.cpp's "neox" GGUFs such as
Qwen2/Qwen3) have their Q/K rows reordered once at load (`adjacent_pairs`).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from pdtop.engine.model.config import ModelConfig, RopeScaling


def inv_freq(cfg: ModelConfig, freq_factors: torch.Tensor | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """`[head_dim / 2]` float32 angular frequencies: `theta ** (-2i / d)`, stretched by
    `cfg.rope_scaling` and divided by `freq_factors` (a GGUF's `rope_freqs.weight`)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    if cfg.rope_scaling is not None:
        inv = inv / scaling_divisors(cfg.rope_scaling, inv)
    if freq_factors is not None:
        inv = inv / freq_factors.to(device=device, dtype=torch.float32)
    return inv


def scaling_divisors(s: RopeScaling, inv: torch.Tensor) -> torch.Tensor:
    """Per-frequency divisors of `inv` for a scaling scheme (HF's `_compute_*_parameters`).

    llama3: wavelengths longer than `original_context / low_freq_factor` are slowed down
    by `factor`, those shorter than `original_context / high_freq_factor` are kept, and
    the band between blends the two linearly in `original_context / wavelength`.
    (llama.cpp's converter stores exactly these divisors as `rope_freqs.weight`.)
    """
    if s.kind == "linear":
        return torch.full_like(inv, s.factor)
    if s.kind != "llama3":
        raise ValueError(f"unknown RoPE scaling {s.kind!r}")
    wavelen = 2 * math.pi / inv
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = 1.0 / ((1 - smooth) / s.factor + smooth)
    long_waves = wavelen > s.original_context / s.low_freq_factor
    short_waves = wavelen < s.original_context / s.high_freq_factor
    return torch.where(long_waves, torch.full_like(inv, s.factor), torch.where(short_waves, 1.0, blended))


def adjacent_pairs(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder each head's rows (or entries) from rotate-half pairs (i, i + d/2) to adjacent
    pairs (2i, 2i + 1): llama.cpp's converter `permute`. Applied to Q and K alike, it leaves
    q.k unchanged and makes RoPE one complex multiply."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
