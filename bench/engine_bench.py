"""Engine speed on the default model: decode tok/s at batch 1 and 32, and a long prefill,
side by side with HF transformers on the same GGUF when transformers is installed.

    .venv/bin/python bench/engine_bench.py [--threads 2] [--dtypes float32,bfloat16] [--engines pdtop,hf]

Each figure is the best of --repeats runs (other processes on a small machine only
ever make a run slower). Decode figures exclude the prefill; every sequence in a
batch has the same prompt length (so HF needs no padding) and greedy decoding.
The prefill figure is the time to the first token of one --prefill-tokens prompt
(logits of the last position only, for both engines). Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402


@dataclass
class Row:
    engine: str
    dtype: str
    b1: float | None = None      # tok/s
    b32: float | None = None     # tok/s
    prefill: float | None = None  # s
    note: str = ""


def best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 40000), (n,), generator=g).tolist()


def bench_pdtop(dtype: str, args: argparse.Namespace) -> Row:
    from pdtop.engine.gguf_loader import load_model
    from pdtop.engine.runner import ModelRunner, SamplingParams

    model = load_model(None, dtype=dtype)
    vocab = model.config.vocab
    runner = ModelRunner(model, kv_capacity_tokens=max(args.prefill_tokens + 64,
                                                       32 * (args.prompt_tokens + args.steps + 8) + 256))
    row = Row("pdtop", dtype)

    def decode_rate(bs: int) -> float:
        seqs = [runner.add_sequence(prompt_ids(args.prompt_tokens, vocab, i),
                                    SamplingParams(max_tokens=args.steps + 4, ignore_eos=True)) for i in range(bs)]
        runner.prefill(seqs)
        runner.decode(seqs)  # warm-up step
        t = time.perf_counter()
        for _ in range(args.steps):
            runner.decode(seqs)
        dt = time.perf_counter() - t
        for s in seqs:
            runner.free(s)
        return bs * args.steps / dt

    def prefill_time() -> float:
        seq = runner.add_sequence(prompt_ids(args.prefill_tokens, vocab, 99), SamplingParams(max_tokens=1))
        t = time.perf_counter()
        runner.prefill([seq])
        dt = time.perf_counter() - t
        runner.free(seq)
        return dt

    decode_rate(1)  # warm up kernels and allocator
    row.b1 = -best(lambda: -decode_rate(1), args.repeats)
    row.b32 = -best(lambda: -decode_rate(32), args.repeats)
    prefill_time()
    row.prefill = best(prefill_time, args.repeats)
    return row


def bench_hf(dtype: str, args: argparse.Namespace) -> Row:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from pdtop.engine.gguf_loader import default_model_path

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=getattr(torch, dtype)).eval()
    vocab = model.config.vocab_size
    row = Row("hf", dtype, note=f"transformers {__import__('transformers').__version__}")

    @torch.inference_mode()
    def decode_rate(bs: int) -> float:
        ids = torch.tensor([prompt_ids(args.prompt_tokens, vocab, i) for i in range(bs)])
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)  # warm-up step
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(args.steps):
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return bs * args.steps / (time.perf_counter() - t)

    @torch.inference_mode()
    def prefill_time() -> float:
        ids = torch.tensor([prompt_ids(args.prefill_tokens, vocab, 99)])
        t = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        out.logits[:, -1].argmax(-1)
        return time.perf_counter() - t

    decode_rate(1)
    row.b1 = -best(lambda: -decode_rate(1), args.repeats)
    row.b32 = -best(lambda: -decode_rate(32), args.repeats)
    prefill_time()
    row.prefill = best(prefill_time, args.repeats)
    return row


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--engines", default="pdtop,hf")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of the decode runs")
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    for dtype in args.dtypes.split(","):
        for engine in args.engines.split(","):
            if engine == "hf":
                try:
                    import transformers  # noqa: F401
                except ImportError:
                    rows.append(Row("hf", dtype, note="transformers not installed (pip install '.[peers]')"))
                    continue
            fn = bench_pdtop if engine == "pdtop" else bench_hf
            try:
                rows.append(fn(dtype, args))
            except Exception as e:  # a peer that cannot run is reported, not fatal
                rows.append(Row(engine, dtype, note=f"failed: {type(e).__name__}: {e}"[:100]))
            gc.collect()
            r = rows[-1]
            print(f"  {r.engine} {r.dtype}: b1 {fmt(r.b1, '.1f')} tok/s, b32 {fmt(r.b32, '.1f')} tok/s, "
                  f"prefill {fmt(r.prefill, '.2f')} s {r.note}", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cores; prompt {args.prompt_tokens} "
          f"tokens, {args.steps} decode steps, prefill {args.prefill_tokens} tokens; best of {args.repeats}")
    head = f"{'engine':8} {'dtype':9} {'decode b1 tok/s':>16} {'decode b32 tok/s':>17} {'prefill ' + str(args.prefill_tokens) + ' s':>14}  note"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.engine:8} {r.dtype:9} {fmt(r.b1, '16.1f')} {fmt(r.b32, '17.1f')} {fmt(r.prefill, '14.2f')}  {r.note}")
    by = {(r.engine, r.dtype): r for r in rows}
    for dtype in args.dtypes.split(","):
        p, h = by.get(("pdtop", dtype)), by.get(("hf", dtype))
        if p and h and None not in (p.b1, h.b1, p.b32, h.b32, p.prefill, h.prefill):
            print(f"{'pdtop/hf':8} {dtype:9} {p.b1 / h.b1:15.2f}x {p.b32 / h.b32:16.2f}x "
                  f"{h.prefill / p.prefill:13.2f}x  (prefill: hf time / pdtop time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
