"""Each GGUF block type's matmul on its blocks (csrc/quant.c, csrc/quant_k.c) beside Q4_1's, at 1 and 32
activation rows: one weight of SmolLM2's ffn_down shape (out 576, in 1536: a multiple of 256, so the K
types fit) and one of its gate_up (out 3072, in 1536 here, a weight that no longer fits in L2), timed
alone with the median of the repeats, in turns (type by type, then again), with the fast and the
forced-portable paths.

    .venv/bin/python bench/quant_k_bench.py [--rows 1,32] [--repeats 50] [--threads 2] [--isa avx2]

Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pdtop  # noqa: F401, I001 (before torch: how OpenMP threads wait)
import torch

from pdtop.engine.model import quant_kernels

SHAPES = {"down": (576, 1536), "big": (3072, 1536)}  # name -> (out, in)
ORDER = [3, 2, 8, 6, 7, 12, 13, 14]  # Q4_1 first: the baseline


def timed(k: quant_kernels.QuantKernels, qtype: int, w: torch.Tensor, x: torch.Tensor, portable: bool,
          repeats: int) -> float:
    times = []
    for i in range(repeats + 3):
        t = time.perf_counter()
        k.matmul(qtype, w, x.shape[1], x, portable)
        if i >= 3:
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,32", help="activation rows, comma-separated (default 1,32)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads (default: torch's)")
    ap.add_argument("--isa", default="native", help="quant_k.c built for: native (default), avx2, portable")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    k = quant_kernels.kernels() if args.isa == "native" else quant_kernels.kernels_for_isa(args.isa)
    if k is None:
        print(f"the quantized kernels ({args.isa}) are unavailable here", file=sys.stderr)
        return 1
    from pdtop.engine.devices.host import machine_line

    print(machine_line(), flush=True)
    print(f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    rows = [int(r) for r in args.rows.split(",")]
    weights = {(q, s): torch.from_numpy(quant_kernels.random_blocks(q, *SHAPES[s], seed=q)[0])
               for q in ORDER if q in k.types for s in SHAPES}
    print(f"{'type':5} {'path':12} {'shape':5} {'rows':>4} {'us':>9} {'x Q4_1':>7} {'GB/s':>6}")
    for shape, (_, in_f) in SHAPES.items():
        for n in rows:
            x = torch.randn(n, in_f)
            for portable in (False, True):
                types = [q for q in ORDER if (q, shape) in weights]
                best = {q: float("inf") for q in types}
                for _ in range(2):  # in turns: every type, then every type again; the better of the two
                    for q in types:
                        best[q] = min(best[q], timed(k, q, weights[q, shape], x, portable, args.repeats))
                base = best[types[0]]
                for qtype in types:
                    w, t = weights[qtype, shape], best[qtype]
                    path = "portable" if portable else quant_kernels.path_name(k, qtype)
                    print(f"{quant_kernels.QUANT_TYPES[qtype]:5} {path:12} {shape:5} {n:>4} {t * 1e6:>9.1f} "
                          f"{t / base:>7.2f} {w.numel() / t / 1e9:>6.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
