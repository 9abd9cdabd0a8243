"""The `--dtype gguf` matmuls on their own, side by side per way of computing them: each linear of the
shipped model (SmolLM2-135M Q4_1, its tied LM head Q8_0) on random blocks of its type, at several
row counts, timed alone with its weight hot in cache. Columns: milliseconds per step (every linear
of a forward pass: 30 layers, one LM head) for oneDNN float32 on the dequantized weight, the dense
path (dequantize 1 Mi-weight slices + oneDNN: what `QuantLinear` runs from `DENSE_ROWS` rows on,
on the portable path only),
and csrc/quant.c's per-row dots and panels on each path built here. The fastest column per row
count is how `quant_linear.DENSE_ROWS` and quant.c's `TILED_MIN` were chosen.

    .venv/bin/python bench/quant_bench.py [--rows 1,4,8,16,32,48,64,128,512] [--repeats 9] [--cpu-time]

Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pdtop  # noqa: F401, I001 (before torch: how OpenMP threads wait)
import torch
import torch.nn.functional as F

from pdtop.engine.model import quant_kernels
from pdtop.engine.model.quant_linear import QuantLinear, QuantWeight

# name -> (in, out, type, how many per forward pass)
SHAPES = {"qkv": (576, 960, 3, 30), "o": (576, 576, 3, 30), "gate_up": (576, 3072, 3, 30),
          "down": (1536, 576, 3, 30), "lm_head": (576, 49152, 8, 1)}


def best_ms(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Median of `repeats` timed calls after two warm-ups, in ms."""
    times = []
    for i in range(repeats + 2):
        t = clock()
        fn()
        if i >= 2:
            times.append(clock() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,32,48,64,128,512", help="row counts (comma-separated)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="linears to time (default: all)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread, timed by its CPU time (steadier on a busy machine than wall time)")
    args = ap.parse_args()
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.thread_time
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)
    k = quant_kernels.kernels()
    if k is None:
        print("the quantized kernels are unavailable here")
        return 1
    ways: dict[str, Callable[[QuantWeight, torch.Tensor, torch.Tensor], object]] = {
        "fp32": lambda q, dense, x: F.linear(x, dense),
        "dense": lambda q, dense, x: QuantLinear(q)._dense(x),
    }
    def run(path: int, tiled: bool) -> Callable[[QuantWeight, torch.Tensor, torch.Tensor], object]:
        return lambda q, dense, x: k.matmul(q.qtype, q.blocks, q.in_features, x, path=path, tiled=tiled)

    for path in k.paths[1:] or k.paths:
        name = quant_kernels.PATHS[path]
        ways[f"{name}-rows"] = run(path, False)
        if path:
            ways[f"{name}-panels"] = run(path, True)
    weights = {}
    for name in args.shapes.split(","):
        n_in, n_out, qtype, _ = SHAPES[name]
        raw, dequantized = quant_kernels.random_blocks(qtype, n_out, n_in, seed=0)
        weights[name] = (QuantWeight(torch.from_numpy(raw), qtype, n_in), torch.from_numpy(dequantized))
    print(f"{'CPU' if args.cpu_time else 'wall'} ms per forward pass (all linears); the fastest marked *")
    print(f"{'rows':>5} " + " ".join(f"{w:>18}" for w in ways))
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            totals = dict.fromkeys(ways, 0.0)
            for name, (q, dense) in weights.items():
                x = torch.randn(rows, q.in_features)
                for way, fn in ways.items():
                    totals[way] += best_ms(functools.partial(fn, q, dense, x), args.repeats, clock) * SHAPES[name][3]
            best = min(totals.values())
            print(f"{rows:>5} " + " ".join(f"{t:>17.2f}{'*' if t == best else ' '}" for t in totals.values()),
                  flush=True)
    print(f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
