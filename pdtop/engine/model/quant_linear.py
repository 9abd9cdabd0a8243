"""Weights kept as the GGUF's quantized blocks (`--dtype gguf`), and the layers that compute on them.

`QuantWeight` is one `[out, in]` weight as the file stores it (uint8 `[out, row_bytes]` blocks of
one type); `QuantLinear` multiplies by it with `quant_kernels` (int8 activations, integer dots);
`linear` makes a `QuantLinear` for a `QuantWeight` and the float `Linear` for a tensor, so the
model builds its layers the same way either way.

The int8 dots win at every batch size where the CPU has AVX2 or AVX-512 VNNI: per-row dots while
the matmul is memory-bound (decode), panels (csrc/quant.c: each weight block unpacked once for many
rows) once it is compute-bound (big batches, prefill). Only the portable path is slower than
oneDNN's float32 from a few rows on, so there (`DENSE_ROWS`; for quant_k.c's types, which have
per-row dots only, from 48 rows: `MORE_DENSE_ROWS`) the weight is dequantized a slice of
DENSE_SLICE weights at a time (the transient float copy stays a few MiB) and multiplied in float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pdtop.engine.model import quant_kernels
from pdtop.engine.model.linear import Linear


def _dequantize(raw: np.ndarray, qtype: int) -> np.ndarray:
    """gguf's dequantize, imported when first used: the model imports without gguf (a GPU machine
    running `bench/gpu_check.py` may not have it)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType(qtype))


@dataclass
class QuantWeight:
    blocks: torch.Tensor  # uint8 [out, row_bytes]
    qtype: int            # a `quant_kernels.QUANT_TYPES` key
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.in_features

    @property
    def type_name(self) -> str:
        return quant_kernels.QUANT_TYPES[self.qtype]

    def dequantize(self) -> torch.Tensor:
        """float32 `[out, in]` (gguf's reference dequantization)."""
        return torch.from_numpy(_dequantize(self.blocks.numpy(), self.qtype).copy())

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` dequantized (the embedding lookup), float32 `[*ids.shape, in]`."""
        k = quant_kernels.kernels()
        if k is None:  # not built here: gguf's numpy dequantization of just those rows
            flat = ids.reshape(-1)
            return torch.from_numpy(_dequantize(self.blocks[flat].numpy(), self.qtype).copy()
                                    ).view(*ids.shape, self.in_features)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.blocks.shape[0]):
            raise IndexError(f"token id out of range 0..{self.blocks.shape[0] - 1}")
        return k.rows(self.qtype, self.blocks, self.in_features, ids.reshape(-1)).view(*ids.shape, self.in_features)


# rows from which dequantize + oneDNN float32 is faster, per quant_kernels.PATHS key (None: never);
# measured with bench/quant_bench.py on an AVX-512 EPYC: the panels are 3-5x oneDNN from 3 rows to
# 512 (the AVX2 ones 2-3x), the portable dots 2x slower than dequantize + oneDNN from 2 rows on
DENSE_ROWS: dict[int, int | None] = {0: 2, 1: None, 2: None}
# quant_k.c's types (Q5, K-quants) have per-row dots only: dequantize + oneDNN from 48 rows there
# (quant.c's crossover before its panels), from 2 on their portable path
MORE_DENSE_ROWS: dict[int, int | None] = {0: 2, 1: 48, 2: 48}
DENSE_SLICE = 1 << 20  # weights dequantized at once on the dense path (4 MiB of float32)


class QuantLinear(nn.Module):
    """`y = x @ W.T (+ bias)` on W's quantized blocks; float32 in and out, CPU only."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape
        kernels = quant_kernels.kernels()
        if kernels is None:
            raise RuntimeError("the quantized kernels are unavailable here")
        self.kernels = kernels
        more = weight.qtype in quant_kernels.MORE_TYPES
        self.dense_rows = (MORE_DENSE_ROWS if more else DENSE_ROWS).get(kernels.fast_k if more else kernels.fast)
        self._matmul = kernels.bind(weight.qtype, weight.blocks, weight.in_features)
        # the C call itself, for `cpu_decode`'s fast path (the blocks live as long as this layer)
        self.entry = kernels.entry_args(weight.qtype, weight.blocks, weight.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.out_features)
        x = x if x.dtype == torch.float32 else x.float()
        if self.dense_rows is not None and x.shape[0] >= self.dense_rows:
            return self._dense(x)
        y = self._matmul(x)
        return y if self.bias is None else y.add_(self.bias)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T in float32, W dequantized a slice of rows at a time."""
        w, step = self.weight, max(1, DENSE_SLICE // self.in_features)
        parts = []
        for start in range(0, self.out_features, step):
            ids = torch.arange(start, min(start + step, self.out_features))
            rows = self.kernels.rows(w.qtype, w.blocks, w.in_features, ids)
            bias = None if self.bias is None else self.bias[start:start + step]
            parts.append(F.linear(x, rows, bias))
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, "
                f"type={self.weight.type_name}")


def linear(weight: torch.Tensor | QuantWeight, bias: torch.Tensor | None = None) -> Linear | QuantLinear:
    """The layer for this weight: on its quantized blocks, or the float `Linear`."""
    return QuantLinear(weight, bias) if isinstance(weight, QuantWeight) else Linear(weight, bias)


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantWeight) -> torch.Tensor:
    """`F.embedding`, or the rows dequantized from the blocks."""
    return weight.rows(ids) if isinstance(weight, QuantWeight) else F.embedding(ids, weight)


def weights_line(weights: list[QuantWeight]) -> str:
    """`gguf Q4_1+Q8_0 (avx2)`: the kept block types and the dot-product path, for describe(); where
    the types' paths differ, each type's (`gguf Q4_K+Q6_K+Q8_0 (Q4_K avx2, Q6_K avx2, Q8_0 avx512-vnni)`)."""
    k = quant_kernels.kernels()
    qtypes = sorted({w.qtype for w in weights}, key=quant_kernels.QUANT_TYPES.__getitem__)
    types = "+".join(quant_kernels.QUANT_TYPES[t] for t in qtypes)
    if k is None:
        return f"gguf {types} (unavailable)"
    paths = {t: quant_kernels.path_name(k, t) for t in qtypes}
    if len(set(paths.values())) == 1:
        return f"gguf {types} ({paths[qtypes[0]]})"
    return f"gguf {types} ({', '.join(f'{quant_kernels.QUANT_TYPES[t]} {p}' for t, p in paths.items())})"


def fused_blocks(parts: list[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor | QuantWeight:
    """Weights to be fused along their rows (q|k|v, gate|up): one `QuantWeight` when all are blocks of
    one type, else float tensors (dequantized where they are blocks) concatenated."""
    from pdtop.engine.model.gguf_blocks import RawBlocks

    if all(isinstance(p, RawBlocks) for p in parts) and len({p.qtype for p in parts}) == 1:
        raw = parts[0].raw if len(parts) == 1 else np.concatenate([p.raw for p in parts])
        return QuantWeight(torch.from_numpy(raw), parts[0].qtype, parts[0].shape[1])
    floats = [torch.from_numpy(np.asarray(_dequantize(p.raw, p.qtype), dtype=np.float32))
              if isinstance(p, RawBlocks) else torch.from_numpy(p) for p in parts]
    return torch.cat(floats).to(device=device, dtype=dtype).contiguous()
