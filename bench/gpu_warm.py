#!/usr/bin/env python3
"""Triton's decode kernels compiled ahead, in parallel, into TRITON_CACHE_DIR: every variant the GPU check
and the cuda tests launch, so neither waits on a cold compile (4-5 s a bfloat16 variant, 13 s a float32
one, one after another in a single process). bench/gpu_run.sh's preflight runs it.

    TRITON_CACHE_DIR=/tmp/pdtop-triton-cache python3 bench/gpu_warm.py [--workers N]

A variant of `triton_decode`'s kernels is fixed by the model's head shape (heads, KV heads, head
size), its dtype and the number of context splits: the one int that varies with the batch, the block
table's width, is not specialized on, and every other stride is a multiple of 16 for any head size
pdtop's models have. So running `paged_decode` once per (shape, dtype, splits) on a few rows compiles
what the check (`synthetic:qwen3-8b`, bfloat16) and the tests (that shape in float32 too, and
`synthetic:smollm2-135m` in both) will ask for, and Triton's on-disk cache hands it to them. Each
job runs in its own process (spawned: each has its own CUDA context), the slowest (float32) first.
Prints one line per job and a last one, `warm: N of M variants in S s on P processes`; exit 1 if a
job failed (the check and the tests then compile what they miss themselves).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this repository's pdtop

from pdtop.engine.model.paged_attention import MAX_SPLITS

SHAPES = ("synthetic:qwen3-8b", "synthetic:smollm2-135m")  # the check's model; the tests' small one
DTYPES = ("float32", "bfloat16")  # float32 first: its compiles are the slow ones
SPLITS = tuple(1 << i for i in range(MAX_SPLITS.bit_length()))  # every split count decode_splits can pick
PAGE = 16  # the runner's KV block size

Job = tuple[str, str, int]


def jobs() -> list[Job]:
    """Every (shape, dtype, splits), float32 first, most splits first (two kernels: split and merge)."""
    return [(shape, dtype, splits) for dtype in DTYPES for splits in reversed(SPLITS) for shape in SHAPES]


def warm(job: Job) -> tuple[Job, float, str]:
    """Compile and run one variant on a few rows; (job, seconds, "" or why it failed)."""
    shape, dtype, splits = job
    t = time.perf_counter()
    try:
        import torch

        from pdtop.engine.model.config import synthetic_config
        from pdtop.engine.model.paged_attention import paged_decode

        cfg = synthetic_config(shape)
        dt, dev = getattr(torch, dtype), torch.device("cuda")
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        rows, blocks = 3, 12
        k, v = (torch.randn(kvh, blocks * PAGE + 1, d, device=dev, dtype=dt) for _ in range(2))  # + the pad slot
        q = torch.randn(rows, h + 2 * kvh, d, device=dev, dtype=dt)[:, :h]  # a view of qkv, as the model's
        table = torch.arange(blocks, device=dev, dtype=torch.int32).view(rows, -1)
        ctx = torch.tensor([1, 37, 4 * PAGE], device=dev, dtype=torch.int32)
        paged_decode(q, k, v, table, ctx, PAGE, d ** -0.5, splits)
        torch.cuda.synchronize()
    except Exception as exc:
        return job, time.perf_counter() - t, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return job, time.perf_counter() - t, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=min(len(jobs()), os.cpu_count() or 1))
    args = ap.parse_args()
    if not os.environ.get("TRITON_CACHE_DIR"):
        print("warm: TRITON_CACHE_DIR is not set: the check and the tests would not find these kernels")
        return 1
    todo, t0, failed = jobs(), time.perf_counter(), 0
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in as_completed([pool.submit(warm, job) for job in todo]):
            (shape, dtype, splits), seconds, error = done.result()
            failed += bool(error)
            print(f"warm: {shape} {dtype} splits {splits}: {error or 'ok'} ({seconds:.1f} s)", flush=True)
    print(f"warm: {len(todo) - failed} of {len(todo)} variants in {time.perf_counter() - t0:.0f} s on "
          f"{args.workers} process{'es' if args.workers != 1 else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
