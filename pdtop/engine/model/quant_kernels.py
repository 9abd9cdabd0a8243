"""The quantized-block kernels: matmuls on a GGUF's blocks as stored, and dequantizing chosen rows (the
embedding); built and loaded as `cpu_kernels` builds the others. `csrc/quant.c` computes on Q4_0 /
Q4_1 / Q8_0, `csrc/quant_k.c` on Q5_0 / Q5_1 (blocks of 32) and Q4_K / Q5_K / Q6_K (super-blocks
of 256, as in Q4_K_M files).

Each activation row is quantized to int8 as llama.cpp's vec_dot does: per block of 32 (Q8_0/Q8_1)
for the block-32 types, per 256 (Q8_K, with per-16 sums) for the K types, so a result differs from
`dequantize(W) @ x` by that rounding (about 0.3% of a row's norm per 32, about 0.5% per 256).
`kernels()` checks every path, for every type and for odd shapes, once when it loads (quant.c's:
portable, AVX2 and AVX-512 VNNI, the last two with per-row and panel loops; quant_k.c's: AVX2 or
VNNI and portable): against `gguf.quants.dequantize` times the int8-rounded activations (the
kernel's own arithmetic: equal up to float summation order) and against the exact float matmul
(within the rounding above). A wrong quant.c type means None (the model loads as float32); a
quant_k.c type that is missing or wrong is left out of `types`, and those tensors load as float32.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pdtop.engine.model import cpu_kernels

log = logging.getLogger(__name__)
# gguf's GGMLQuantizationType values (read in tests): quant.c's, then quant_k.c's
BASE_TYPES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}
MORE_TYPES = {6: "Q5_0", 7: "Q5_1", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
QUANT_TYPES = {**BASE_TYPES, **MORE_TYPES}
K_TYPES = frozenset({12, 13, 14})
PATHS = {0: "portable", 1: "avx2", 2: "avx512-vnni"}  # the C `path` values
BLOCK = 32
EXACT_TOL = 1e-4  # vs dequantize(W) @ int8-rounded x: only float summation order differs
ROUNDING_TOL = 0.02  # vs dequantize(W) @ x, relative to the result's norm (int8 activations)
TEAM_ROWS = 2731  # output rows from which a 96-column, 1-row matmul is split over threads (PARALLEL_MIN)


# a matmul's C function, its leading arguments (type, blocks, out, in) and its trailing ones (path, tiled)
MatmulEntry = tuple[Callable[..., int], tuple[int, ...], tuple[int, ...]]


def block_len(qtype: int) -> int:
    """Weights per block: 256 for the K types, else 32 (a row's in_features must be a multiple)."""
    return 256 if qtype in K_TYPES else BLOCK


@dataclass(frozen=True)
class QuantKernels:
    lib: ctypes.CDLL
    fast: int  # quant.c's fast path built here: 0 none (only the portable one runs), 1 AVX2, 2 AVX-512 VNNI
    lib_k: ctypes.CDLL | None = None  # quant_k.c, None when it could not be built
    fast_k: int = 0  # its fast path: 0 none (only the portable one runs), 1 AVX2, 2 AVX-512 VNNI
    types: frozenset[int] = frozenset(BASE_TYPES)  # the types whose kernels passed the check

    @property
    def paths(self) -> list[int]:
        """The paths that run here, portable first: `PATHS` keys up to `fast`."""
        return list(range(self.fast + 1))

    def has_fast(self, qtype: int) -> bool:
        """Whether `qtype` has a fast (non-portable) path here, beside the portable one."""
        return (self.fast_k if qtype in MORE_TYPES else self.fast) > 0

    def _entry(self, qtype: int, what: str) -> Callable[..., int]:
        """The C function `what` (matmul, rows) of the file that computes on `qtype`."""
        if qtype in MORE_TYPES and self.lib_k is not None:
            return getattr(self.lib_k, f"pdtop_quant_k_{what}")
        if qtype in BASE_TYPES:
            return getattr(self.lib, f"pdtop_quant_{what}")
        raise ValueError(f"no quantized kernel for type {QUANT_TYPES.get(qtype, qtype)} here")

    def matmul(self, qtype: int, w: torch.Tensor, in_f: int, x: torch.Tensor, portable: bool = False, *,
               path: int | None = None, tiled: bool | None = None) -> torch.Tensor:
        """`x [n, in_f] float32` @ W^T -> `[n, out]`, W the uint8 `[out, row_bytes]` blocks of `qtype`.
        `portable` (or `path=0`) forces the portable path; for quant.c's types `path` forces a `PATHS`
        key (default the fastest built, lowered to it) and `tiled` the panel (True) or per-row (False)
        loops (default: panels from a few rows on; the portable path has per-row loops only)."""
        return self.bind(qtype, w, in_f, portable, path=path, tiled=tiled)(x)

    def bind(self, qtype: int, w: torch.Tensor, in_f: int, portable: bool = False, *, path: int | None = None,
             tiled: bool | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
        """`x -> matmul(qtype, w, in_f, x, ...)` with the checks and look-ups done once (a layer's
        weight: a batch-1 step makes ~120 of these calls, where each microsecond of Python shows)."""
        fn, head, tail = self.entry_args(qtype, w, in_f, portable, path=path, tiled=tiled)
        out_f = w.shape[0]

        def run(x: torch.Tensor, _w: torch.Tensor = w) -> torch.Tensor:  # _w: the blocks outlive the pointer
            x = x.contiguous()
            y = torch.empty(x.shape[0], out_f, dtype=torch.float32)
            if fn(*head, x.data_ptr(), x.shape[0], y.data_ptr(), *tail):
                raise MemoryError(f"quantized matmul failed ({QUANT_TYPES.get(qtype, qtype)}, {tuple(x.shape)})")
            return y
        return run

    def entry_args(self, qtype: int, w: torch.Tensor, in_f: int, portable: bool = False, *,
                   path: int | None = None, tiled: bool | None = None) -> MatmulEntry:
        """`(fn, head, tail)` such that `fn(*head, x_ptr, n, y_ptr, *tail)` is `bind`'s matmul into `y`
        (returning nonzero on failure); `w` must outlive the calls (`cpu_decode` calls it directly)."""
        if in_f % block_len(qtype):
            raise ValueError(f"{QUANT_TYPES.get(qtype, qtype)} rows need in_features a multiple of "
                             f"{block_len(qtype)}, not {in_f}")
        fn, path = self._entry(qtype, "matmul"), 0 if portable else path
        tail = ((self.fast if path is None else path, -1 if tiled is None else int(tiled)) if qtype in BASE_TYPES
                else (int(path == 0),))
        return fn, (qtype, w.data_ptr(), w.shape[0], in_f), tail

    def rows(self, qtype: int, w: torch.Tensor, in_f: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W dequantized: `[len(ids), in_f] float32` (ids must be in range)."""
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.numel(), in_f, dtype=torch.float32)
        self._entry(qtype, "rows")(qtype, w.data_ptr(), in_f, ids.data_ptr(), ids.numel(), out.data_ptr())
        return out


def round_activations(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """x as the kernel sees it: each block of `block` (32, or 256 for the K types) rounded to int8
    steps of amax / 127."""
    b = x.reshape(*x.shape[:-1], -1, block)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(b * inv) * d).reshape(x.shape)


def random_blocks(qtype: int, out_f: int, in_f: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw uint8 blocks, their float32 dequantization) of a random `[out_f, in_f]` weight of `qtype`."""
    from gguf import GGMLQuantizationType  # imported when used: the model imports without gguf
    from gguf.quants import dequantize, quantize

    if qtype in K_TYPES:  # gguf-py cannot quantize these: random valid blocks
        from pdtop.engine.model.k_blocks import random_k_blocks

        raw = random_k_blocks(qtype, out_f, in_f, seed)
    else:
        w = np.random.default_rng(seed).standard_normal((out_f, in_f)).astype(np.float32)
        raw = quantize(w, GGMLQuantizationType(qtype))
    return raw, np.asarray(dequantize(raw, GGMLQuantizationType(qtype)), dtype=np.float32)


def check(k: QuantKernels, qtype: int, out_f: int, in_f: int, n: int, portable: bool = False, seed: int = 0, *,
          path: int | None = None, tiled: bool | None = None) -> str | None:
    """None when the kernel (`portable`, or `path` and `tiled`, forced as `matmul` takes them)
    matches the references on a random weight of this shape, else what differs."""
    return check_ways(k, qtype, out_f, in_f, n, [(0 if portable else path, tiled)], seed)


def check_ways(k: QuantKernels, qtype: int, out_f: int, in_f: int, n: int,
               ways: Sequence[tuple[int | None, bool | None]], seed: int = 0) -> str | None:
    """`check` for each (path, tiled) of `ways` on one random weight and input (made once)."""
    raw, dense = random_blocks(qtype, out_f, in_f, seed)
    x = torch.randn(n, in_f, generator=torch.Generator().manual_seed(seed)) * 3
    w = torch.from_numpy(dense)
    exact, near = round_activations(x, block_len(qtype)) @ w.T, x @ w.T
    scale = float(exact.abs().max()) or 1.0
    for path, tiled in ways:
        y = k.matmul(qtype, torch.from_numpy(raw), in_f, x, path=path, tiled=tiled)
        name = path_name(k, qtype) if path is None else PATHS.get(path, str(path))
        way = f"{name}{', panels' if tiled and path and qtype in BASE_TYPES else ''}"
        if not torch.allclose(y, exact, atol=EXACT_TOL * scale, rtol=EXACT_TOL):
            return f"({way}) off the int8 reference by {float((y - exact).abs().max()):.3g}"
        err = float((y - near).norm() / (near.norm() + 1e-12))
        if err > ROUNDING_TOL:
            return f"({way}) off the float matmul by {err:.3g} relative"
    rows = k.rows(qtype, torch.from_numpy(raw), in_f, torch.tensor([0, out_f - 1]))
    if not torch.equal(rows, w[[0, out_f - 1]]):
        return "row dequantization differs from gguf.quants.dequantize"
    return None


def _bind(lib: ctypes.CDLL, prefix: str, base: ctypes.CDLL | None = None) -> None:
    """Argument types of `lib`'s entry points; quant_k.c's (`base`: quant.c) get quant.c's spin team."""
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    fn = getattr(lib, f"{prefix}_matmul")
    fn.restype = i32
    fn.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr, i32] + ([i32] if prefix == "pdtop_quant" else [])  # path, tiled
    getattr(lib, f"{prefix}_rows").restype = i32
    getattr(lib, f"{prefix}_rows").argtypes = [i32, ptr, i64, ptr, i64, ptr]
    getattr(lib, f"{prefix}_fast_path").restype = i32
    if prefix == "pdtop_quant":
        lib.pdtop_quant_team_spin.restype = i64
        lib.pdtop_quant_team_spin.argtypes = [i64]
    if base is not None:  # one spin team per caller for both files
        lib.pdtop_quant_k_set_team.argtypes = [ptr]
        lib.pdtop_quant_k_set_team(ctypes.cast(base.pdtop_quant_team_run, ptr))


def _problem(k: QuantKernels, qtype: int) -> str | None:
    """What is wrong with `qtype`'s kernels on the load-time shapes (odd, rows and columns not a
    register tile or a panel), or None: every path (quant.c's: per-row dots and panels) built here."""
    # the last shape of each runs on the spin team (csrc/spin_team.h) where torch has 2+ threads
    if qtype in K_TYPES:
        shapes: tuple[tuple[int, int, int], ...] = ((37, 256, 1), (19, 512, 5), (1031, 256, 1))
    elif qtype in BASE_TYPES:
        shapes = ((37, 96, 1), (19, 160, 5), (21, 96, 11), (TEAM_ROWS, 96, 1))
    else:
        shapes = ((37, 96, 1), (19, 160, 5), (21, 96, 11), (1031, 256, 1))
    if qtype in BASE_TYPES:
        ways: list[tuple[int | None, bool | None]] = [(0, False)]
        ways += [(p, t) for p in range(1, k.fast + 1) for t in (False, True)]
    else:
        ways = [(0, None)] + ([(None, None)] if k.has_fast(qtype) else [])
    for out_f, in_f, n in shapes:
        problem = check_ways(k, qtype, out_f, in_f, n, ways)
        if problem:
            return f"the {QUANT_TYPES[qtype]} kernel {problem}"
    return None


@functools.cache
def kernels(isa: str | None = None) -> QuantKernels | None:
    """The checked kernels built for `isa` (a `cpu_kernels.ISAS` key, default `PDTOP_KERNEL_ISA` or
    native), or None when quant.c cannot be built here or disagrees with the references (quant_k.c's
    types that cannot be built or disagree are left out of `types`)."""
    lib = cpu_kernels._library("quant", isa)
    if lib is None:
        return None
    _bind(lib, "pdtop_quant")
    k = QuantKernels(lib, int(lib.pdtop_quant_fast_path()))
    for qtype in BASE_TYPES:
        problem = _problem(k, qtype)
        if problem:
            log.warning("%s; loading float32", problem)
            return None
    lib_k = cpu_kernels._library("quant_k", isa)
    if lib_k is None:
        log.warning("the Q5 / K-quant kernels are unavailable here; those tensors load as float32")
        return k
    _bind(lib_k, "pdtop_quant_k", lib)
    k = QuantKernels(lib, k.fast, lib_k, int(lib_k.pdtop_quant_k_fast_path()), frozenset(QUANT_TYPES))
    bad = set()
    for qtype in MORE_TYPES:
        problem = _problem(k, qtype)
        if problem:
            log.warning("%s; %s tensors load as float32", problem, QUANT_TYPES[qtype])
            bad.add(qtype)
    return QuantKernels(lib, k.fast, lib_k, k.fast_k, k.types - bad) if bad else k


def kernels_for_isa(isa: str) -> QuantKernels | None:
    """The kernels with quant_k.c built for `isa` (a `cpu_kernels.ISAS` key), unchecked, quant.c's
    types on the checked default build: for tests and benchmarks that run every path this CPU can;
    None when they cannot be built or run here."""
    base, lib_k = kernels(), cpu_kernels._library("quant_k", isa)
    if base is None or lib_k is None:
        return None
    _bind(lib_k, "pdtop_quant_k", base.lib)
    return QuantKernels(base.lib, base.fast, lib_k, int(lib_k.pdtop_quant_k_fast_path()), frozenset(QUANT_TYPES))


def path_name(k: QuantKernels, qtype: int | None = None) -> str:
    """Which dot-product path runs (quant.c's, or that of `qtype`'s file), for describe() and the header."""
    return PATHS.get(k.fast_k if qtype in MORE_TYPES else k.fast, "portable")
