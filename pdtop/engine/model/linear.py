"""A linear layer (optional bias) whose CPU weights are pre-packed for oneDNN.

`F.linear` on a plain `[out, in]` float32 weight reaches about half the memory
bandwidth of this machine for one-row inputs (decode) and runs small batches
slowly; oneDNN with the weight reordered once into its blocked layout (what
torch.compile's CPU "freezing" does) is about twice as fast for the shapes of
decode and no slower for prefill. The packing ops are private torch APIs, so
every use is probed once and falls back to `F.linear` if they are missing or
disagree; set PDTOP_NO_PACK=1 to turn packing off (for comparisons).
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 32  # oneDNN picks the blocked layout for this many rows; any row count works


@functools.cache
def packing_available(dtype: torch.dtype) -> bool:
    """oneDNN weight packing works here, for this dtype, and gives F.linear's results."""
    if os.environ.get("PDTOP_NO_PACK"):
        return False
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        g = torch.Generator().manual_seed(0)
        w = torch.randn(48, 40, generator=g).to(dtype)
        b = torch.randn(48, generator=g).to(dtype)
        x = torch.randn(3, 40, generator=g).to(dtype)
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            yb = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=0.05, rtol=0.02)
                    and torch.allclose(yb.float(), F.linear(x, w, b).float(), atol=0.05, rtol=0.02))
    except Exception:
        return False


class Linear(nn.Module):
    """`y = x @ weight.T (+ bias)`. On CPU the weight is held in oneDNN's packed layout instead."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = weight.device.type == "cpu" and packing_available(weight.dtype)
        if self.packed:
            with torch.inference_mode():
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
        self.weight = weight  # `[out, in]`, or oneDNN's blocked copy of it when `packed`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, packed={self.packed}"
