"""What a batch-32 decode step's matmuls cost on their own: each linear of the default model
(SmolLM2-135M: hidden 576, 30 layers, fused QKV and gate/up) timed alone with its weight hot in
cache, in GFLOP/s, and their sum per step. Compared with the real step (bench/engine_bench.py),
the difference is weight streaming from memory plus everything that is not a matmul.

    .venv/bin/python bench/linear_bench.py [--rows 32] [--repeats 30]

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

from pdtop.engine.model.linear import Linear

# name -> (in, out, how many per step)
SHAPES = {"qkv": (576, 960, 30), "o": (576, 576, 30), "gate_up": (576, 3072, 30), "down": (1536, 576, 30),
          "lm_head": (576, 49152, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32, help="decode batch size (default 32)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    torch.manual_seed(0)
    total = 0.0
    print(f"{'linear':8} {'in':>5} {'out':>6} {'ms':>8} {'GFLOP/s':>8} {'x':>3} {'ms/step':>8}")
    for name, (n_in, n_out, count) in SHAPES.items():
        lin, x = Linear(torch.randn(n_out, n_in) * 0.02), torch.randn(args.rows, n_in)
        times = []
        with torch.inference_mode():
            for i in range(args.repeats + 5):
                t = time.perf_counter()
                lin(x)
                if i >= 5:
                    times.append(time.perf_counter() - t)
        t = sorted(times)[len(times) // 2]
        total += t * count
        print(f"{name:8} {n_in:>5} {n_out:>6} {t * 1e3:>8.3f} {2 * args.rows * n_in * n_out / t / 1e9:>8.1f} "
              f"{count:>3} {t * count * 1e3:>8.1f}")
    print(f"matmuls per {args.rows}-row step, weights in cache: {total * 1e3:.1f} ms; "
          f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
