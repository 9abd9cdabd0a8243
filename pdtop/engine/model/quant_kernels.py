"""The quantized-block kernels (`csrc/quant.c`): matmuls on a GGUF's Q4_0 / Q4_1 / Q8_0 blocks as
stored, and dequantizing chosen rows (the embedding); built and loaded as `cpu_kernels` builds
the others.

Each activation row is quantized per block of 32 to int8 (llama.cpp's Q8_0/Q8_1), so a result
differs from `dequantize(W) @ x` by that rounding (about 0.3% of a row's norm). `kernels()` checks
every path built here (portable, AVX2, AVX-512 VNNI; the last two with per-row and panel loops), for
every type and for odd shapes, once when it loads: against
`gguf.quants.dequantize` times the int8-rounded activations (the kernel's own arithmetic: equal
up to float summation order) and against the exact float matmul (within the rounding above).
Anything missing or wrong means None and the model loads as float32.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pdtop.engine.model import cpu_kernels

log = logging.getLogger(__name__)
QUANT_TYPES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}  # gguf's GGMLQuantizationType values (read in tests)
PATHS = {0: "portable", 1: "avx2", 2: "avx512-vnni"}  # csrc/quant.c's `path` values
BLOCK = 32
EXACT_TOL = 1e-4  # vs dequantize(W) @ int8-rounded x: only float summation order differs
ROUNDING_TOL = 0.02  # vs dequantize(W) @ x, relative to the result's norm (int8 activations)


@dataclass(frozen=True)
class QuantKernels:
    lib: ctypes.CDLL
    fast: int  # the fast path built here: 0 none (only the portable one runs), 1 AVX2, 2 AVX-512 VNNI

    @property
    def paths(self) -> list[int]:
        """The paths that run here, portable first: `PATHS` keys up to `fast`."""
        return list(range(self.fast + 1))

    def matmul(self, qtype: int, w: torch.Tensor, in_f: int, x: torch.Tensor, path: int | None = None,
               tiled: bool | None = None) -> torch.Tensor:
        """`x [n, in_f] float32` @ W^T -> `[n, out]`, W the uint8 `[out, row_bytes]` blocks of `qtype`.
        `path` forces a `PATHS` key (default the fastest built), `tiled` the panel (True) or per-row
        (False) loops (default: panels from a few rows on); the portable path has per-row loops only."""
        x = x.contiguous()
        y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
        rc = self.lib.pdtop_quant_matmul(qtype, w.data_ptr(), w.shape[0], in_f, x.data_ptr(), x.shape[0],
                                         y.data_ptr(), self.fast if path is None else path,
                                         -1 if tiled is None else int(tiled))
        if rc:
            raise MemoryError(f"quantized matmul failed ({QUANT_TYPES.get(qtype, qtype)}, {tuple(x.shape)})")
        return y

    def rows(self, qtype: int, w: torch.Tensor, in_f: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W dequantized: `[len(ids), in_f] float32` (ids must be in range)."""
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.numel(), in_f, dtype=torch.float32)
        self.lib.pdtop_quant_rows(qtype, w.data_ptr(), in_f, ids.data_ptr(), ids.numel(), out.data_ptr())
        return out


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: each block of 32 rounded to int8 steps of amax / 127."""
    b = x.reshape(*x.shape[:-1], -1, BLOCK)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(b * inv) * d).reshape(x.shape)


def random_blocks(qtype: int, out_f: int, in_f: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw uint8 blocks, their float32 dequantization) of a random `[out_f, in_f]` weight of `qtype`."""
    w = np.random.default_rng(seed).standard_normal((out_f, in_f)).astype(np.float32)
    from gguf import GGMLQuantizationType  # imported when used: the model imports without gguf
    from gguf.quants import dequantize, quantize

    raw = quantize(w, GGMLQuantizationType(qtype))
    return raw, np.asarray(dequantize(raw, GGMLQuantizationType(qtype)), dtype=np.float32)


def check(k: QuantKernels, qtype: int, out_f: int, in_f: int, n: int, path: int, tiled: bool | None = None,
          seed: int = 0) -> str | None:
    """None when the kernel (`path`, `tiled` forced) matches the references on a random weight of this
    shape, else what differs."""
    return check_ways(k, qtype, out_f, in_f, n, [(path, tiled)], seed)


def check_ways(k: QuantKernels, qtype: int, out_f: int, in_f: int, n: int, ways: Sequence[tuple[int, bool | None]],
               seed: int = 0) -> str | None:
    """`check` for each (path, tiled) of `ways` on one random weight and input (made once)."""
    raw, dense = random_blocks(qtype, out_f, in_f, seed)
    x = torch.randn(n, in_f, generator=torch.Generator().manual_seed(seed)) * 3
    w = torch.from_numpy(dense)
    exact, near = round_activations(x) @ w.T, x @ w.T
    scale = float(exact.abs().max()) or 1.0
    for path, tiled in ways:
        y = k.matmul(qtype, torch.from_numpy(raw), in_f, x, path, tiled)
        way = f"{PATHS.get(path, path)}{', panels' if tiled and path else ''}"
        if not torch.allclose(y, exact, atol=EXACT_TOL * scale, rtol=EXACT_TOL):
            return f"{way}: off the int8 reference by {float((y - exact).abs().max()):.3g}"
        err = float((y - near).norm() / (near.norm() + 1e-12))
        if err > ROUNDING_TOL:
            return f"{way}: off the float matmul by {err:.3g} relative"
    rows = k.rows(qtype, torch.from_numpy(raw), in_f, torch.tensor([0, out_f - 1]))
    if not torch.equal(rows, w[[0, out_f - 1]]):
        return "row dequantization differs from gguf.quants.dequantize"
    return None


@functools.cache
def kernels(isa: str | None = None) -> QuantKernels | None:
    """The checked kernels built for `isa` (a `cpu_kernels.ISAS` key, default `PDTOP_KERNEL_ISA` or
    native), or None when they cannot be built here or disagree with the references."""
    lib = cpu_kernels._library("quant", isa)
    if lib is None:
        return None
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.pdtop_quant_matmul.restype = i32
    lib.pdtop_quant_matmul.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr, i32, i32]
    lib.pdtop_quant_rows.restype = i32
    lib.pdtop_quant_rows.argtypes = [i32, ptr, i64, ptr, i64, ptr]
    lib.pdtop_quant_fast_path.restype = i32
    k = QuantKernels(lib, int(lib.pdtop_quant_fast_path()))
    # odd shapes: rows and columns that are not a register tile or a panel, an odd number of blocks;
    # the portable path's per-row dots, and per-row dots and panels on each faster path
    ways = [(0, False)] + [(path, tiled) for path in k.paths[1:] for tiled in (False, True)]
    for qtype, name in QUANT_TYPES.items():
        for out_f, in_f, n in ((37, 96, 1), (19, 160, 5), (21, 96, 11)):
            problem = check_ways(k, qtype, out_f, in_f, n, ways)
            if problem:
                log.warning("the %s kernel is %s; loading float32", name, problem)
                return None
    return k


def path_name(k: QuantKernels) -> str:
    """Which dot-product path runs, for describe() and the header."""
    return PATHS.get(k.fast, "portable")
