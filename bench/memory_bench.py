"""The engine's memory on the default model: resident set (RSS) against the GGUF file's size plus the
KV cache, per dtype (default: the CPU's default dtype, and float32 beside it).

    .venv/bin/python bench/memory_bench.py [--dtypes default,float32] [--kv-tokens 16384] [--prompt-tokens 1024]

Each dtype runs in a fresh process: the Python + torch + pdtop baseline is read after the imports,
then the model is loaded as `pdtop serve --device cpu` loads it (`build.load_for`), a ModelRunner
gets a --kv-tokens cache, and one --prompt-tokens prefill plus 16 decode steps run (so the
activations and oneDNN's buffers exist). RSS is read then, and the peak (VmHWM) beside it. The KV
cache is `torch.empty`: only the slots written are resident, so its full size in the bound is
generous; --fill-kv writes all of it first. The issue's goal is engine RSS (after - baseline) at
most 1.25x file + KV. Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MiB = 2**20


def status_kib(key: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def measure(dtype: str, kv_tokens: int, prompt_tokens: int, fill_kv: bool) -> dict[str, object]:
    """In this (fresh) process: the baseline, then load, prefill and decode; the figures as a dict."""
    sys.path.insert(0, ROOT)
    import pdtop  # noqa: F401, I001 (before torch, as the CLI imports it)
    import torch

    from pdtop.engine.build import load_for
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner
    from pdtop.engine.scheduling.tokens import append_token

    base = status_kib("VmRSS")
    model = load_for("cpu", dtype=None if dtype == "default" else dtype)
    runner = ModelRunner(model, kv_capacity_tokens=kv_tokens)
    if fill_kv:
        runner.kv.data.fill_(0)
    req = Request(0, list(range(100, 100 + prompt_tokens)), SamplingParams(max_tokens=20, ignore_eos=True))
    runner.admit(req)
    with torch.inference_mode():
        append_token(req, runner.prefill([req])[0], 0.0, ())
        for _ in range(16):
            append_token(req, runner.decode([req])[0], 0.0, ())
    return {"dtype": dtype, "weights": model.weights, "file": default_model_path().stat().st_size,
            "kv": runner.kv.bytes, "base": base * 1024, "rss": status_kib("VmRSS") * 1024,
            "peak": status_kib("VmHWM") * 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="default,float32", help="default (the CPU's), float32, bfloat16, gguf")
    ap.add_argument("--kv-tokens", type=int, default=16384, help="KV cache tokens (default 16384, the CPU's)")
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="the prefill's length (default 1024)")
    ap.add_argument("--fill-kv", action="store_true", help="write the whole KV cache (all of it resident)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.kv_tokens, args.prompt_tokens, args.fill_kv)))
        return 0
    rows = []
    for dtype in args.dtypes.split(","):
        cmd = [sys.executable, __file__, "--child", dtype, "--kv-tokens", str(args.kv_tokens),
               "--prompt-tokens", str(args.prompt_tokens), *(["--fill-kv"] if args.fill_kv else [])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(f"{dtype}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"KV cache {args.kv_tokens} tokens ({'all written' if args.fill_kv else 'only the slots used resident'}); "
          f"one {args.prompt_tokens}-token prefill and 16 decode steps; MiB")
    head = (f"{'dtype':8} {'file':>6} {'KV':>6} {'base':>6} {'RSS':>6} {'peak':>6} {'engine':>7} "
            f"{'engine/(file+KV)':>17} {'RSS/(file+KV)':>14}  weights")
    print(head)
    print("-" * len(head))
    for r in rows:
        bound = r["file"] + r["kv"]
        engine = r["rss"] - r["base"]
        print(f"{r['dtype']:8} {r['file'] / MiB:6.0f} {r['kv'] / MiB:6.0f} {r['base'] / MiB:6.0f} "
              f"{r['rss'] / MiB:6.0f} {r['peak'] / MiB:6.0f} {engine / MiB:7.0f} {engine / bound:16.2f}x "
              f"{r['rss'] / bound:13.2f}x  {r['weights']}")
    print("base: Python + torch + pdtop imported, before the model; engine: RSS - base")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
