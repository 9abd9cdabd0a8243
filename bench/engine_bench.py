"""Engine speed on the default model: decode tok/s at batch 1 and 32, and a long prefill,
side by side with HF transformers and llama.cpp on the same GGUF when they are installed
(`pip install '.[peers]'`; the GGUF is read offline).

    .venv/bin/python bench/engine_bench.py [--threads 2] [--dtypes float32,bfloat16,gguf]
                                           [--engines pdtop,hf,llamacpp]

All engines are loaded first and then measured in turns (pdtop, hf, llamacpp, pdtop, ...),
so load from other processes hits them alike; every one gets --threads threads. Decode figures
exclude the prefill: every sequence of a batch has a --prompt-tokens prompt (the same length, so
HF needs no padding), then each of --steps greedy steps is timed on its own; the figure is
batch size / the 10th percentile of the step times of all --repeats turns (a
machine shared with other work only ever makes a step slower; the median is shown
beside it). The prefill figure is the best of --repeats times to the first token of
one --prefill-tokens prompt (logits of the last position only, for every engine).
`gguf` is pdtop's `--dtype gguf` (matmuls on the file's quantized blocks, the CPU default for
this file); each pdtop row notes the weights it holds (float32 copies, or the blocks). llama.cpp
computes on the blocks too: its one row is `gguf`, measured with the gguf group (or the first),
through its C API (`llamacpp_peer.py`: n_batch/n_ubatch 512, F16 KV cache, batch 32 as 32
sequences of one context). HF dequantizes the file: its rows are float32/bfloat16. Without
--engines, the installed peers run; a peer named in --engines and not installed is one line and
exit 2. Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pdtop  # noqa: F401, I001 (before torch: sets how OpenMP threads wait, pdtop/__init__.py; both engines alike)
import torch

FIGURES = ("b1", "b32", "prefill")


@dataclass
class Engine:
    name: str
    dtype: str
    decode_steps: Callable[[int], list[float]] | None = None  # batch size -> seconds of each step
    prefill_time: Callable[[], float] | None = None    # -> seconds
    results: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""

    def best(self, fig: str, q: float = 0.1) -> float | None:
        """Prefill: the fastest time. Decode: tok/s at the q-quantile step time."""
        v = sorted(self.results.get(fig) or [])
        if not v:
            return None
        if fig == "prefill":
            return v[0]
        return int(fig[1:]) / v[min(len(v) - 1, int(q * len(v)))]


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 40000), (n,), generator=g).tolist()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the tensors the model's modules hold (float weights, or the blocks of `--dtype gguf`)."""
    from pdtop.engine.model.quant_linear import QuantWeight

    held: dict[int, int] = {}
    for m in model.modules():
        for t in vars(m).values():
            t = t.blocks if isinstance(t, QuantWeight) else t
            if isinstance(t, torch.Tensor):
                held[id(t)] = t.numel() * t.element_size()  # oneDNN's packed copies have no storage to share
    return sum(held.values())


def pdtop_engine(dtype: str, args: argparse.Namespace) -> Engine:
    from pdtop.engine.model.loader import load_model
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner
    from pdtop.engine.scheduling.tokens import append_token

    model = load_model(None, dtype=dtype)
    vocab, eos = model.config.vocab, model.config.eos_ids
    runner = ModelRunner(model, kv_capacity_tokens=max(args.prefill_tokens + 64,
                                                       32 * (args.prompt_tokens + args.steps + 8) + 256))

    def admitted(i: int, n: int, max_tokens: int) -> Request:
        req = Request(i, prompt_ids(n, vocab, i), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        runner.admit(req)
        return req

    def take(reqs: list[Request], tokens: list[int]) -> None:
        for r, t in zip(reqs, tokens, strict=True):
            append_token(r, t, 0.0, eos)

    def decode_steps(bs: int) -> list[float]:
        reqs = [admitted(i, args.prompt_tokens, args.steps + 4) for i in range(bs)]
        take(reqs, runner.prefill(reqs))
        take(reqs, runner.decode(reqs))  # first step after a prefill is not timed
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            take(reqs, runner.decode(reqs))
            times.append(time.perf_counter() - t)
        for r in reqs:
            runner.free(r)
        return times

    def prefill_time() -> float:
        req = admitted(99, args.prefill_tokens, 1)
        t = time.perf_counter()
        runner.prefill([req])
        dt = time.perf_counter() - t
        runner.free(req)
        return dt

    note = f"weights {model.weights}, {weight_bytes(model) / 2**20:.0f} MiB held"
    return Engine("pdtop", dtype, decode_steps, prefill_time, note=note)


def hf_engine(dtype: str, args: argparse.Namespace) -> Engine:
    if dtype == "gguf":
        raise ValueError("no gguf dtype in transformers (it dequantizes the file); compare the float32 row")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from pdtop.engine.model.loader import default_model_path

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=getattr(torch, dtype)).eval()
    vocab = model.config.vocab_size

    @torch.inference_mode()
    def decode_steps(bs: int) -> list[float]:
        ids = torch.tensor([prompt_ids(args.prompt_tokens, vocab, i) for i in range(bs)])
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)  # not timed
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t)
        return times

    @torch.inference_mode()
    def prefill_time() -> float:
        ids = torch.tensor([prompt_ids(args.prefill_tokens, vocab, 99)])
        t = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        out.logits[:, -1].argmax(-1)
        return time.perf_counter() - t

    return Engine("hf", dtype, decode_steps, prefill_time, note=f"transformers {transformers.__version__}")


def llamacpp_engine(dtype: str, args: argparse.Namespace) -> Engine:
    from llamacpp_peer import Peer

    from pdtop.engine.model.loader import default_model_path, read_config

    path = default_model_path()
    peer = Peer(str(path), args.threads, args.prefill_tokens + 64, args.llamacpp_wait == "own")
    vocab = read_config(path).vocab  # the same prompts as pdtop's

    def decode_steps(bs: int) -> list[float]:
        return peer.ask({"prompts": [prompt_ids(args.prompt_tokens, vocab, i) for i in range(bs)],
                         "steps": args.steps})

    def prefill_time() -> float:
        return peer.ask({"prefill": prompt_ids(args.prefill_tokens, vocab, 99)})[0]

    return Engine("llamacpp", "gguf", decode_steps, prefill_time,
                  note=f"{peer.version}, n_batch/n_ubatch 512, OpenMP wait {peer.wait}")


ENGINES: dict[str, Callable[[str, argparse.Namespace], Engine]] = {
    "pdtop": pdtop_engine, "hf": hf_engine, "llamacpp": llamacpp_engine}
PEERS = {"hf": ("transformers", "transformers"), "llamacpp": ("llama_cpp", "llama-cpp-python")}  # module, package


def chosen_engines(text: str | None) -> list[str] | str:
    """--engines as names, or the one line that says why not (an unknown name, a peer not installed).
    Without --engines: pdtop and the installed peers."""
    import importlib.util

    if text is None:
        return ["pdtop", *(n for n, (mod, _) in PEERS.items() if importlib.util.find_spec(mod) is not None)]
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in ENGINES:
            return f"unknown engine {name!r}; use {', '.join(ENGINES)}"
        if name in PEERS and importlib.util.find_spec(PEERS[name][0]) is None:
            return f"{name} needs {PEERS[name][1]}, which is not installed: pip install '.[peers]'"
    return names


def measured_with(name: str, dtype: str, dtypes: list[str]) -> bool:
    """Whether engine `name` has a `dtype` row: llama.cpp once (gguf, else the first dtype's group),
    HF for the float dtypes, pdtop for every one."""
    if name == "llamacpp":
        return dtype == ("gguf" if "gguf" in dtypes else dtypes[0])
    return name != "hf" or dtype != "gguf"


def run_turn(e: Engine, fig: str) -> None:
    assert e.prefill_time is not None and e.decode_steps is not None  # a loaded engine's (not a table row's)
    values = [e.prefill_time()] if fig == "prefill" else e.decode_steps(int(fig[1:]))
    e.results.setdefault(fig, []).extend(values)


def progress(e: Engine, fig: str, q: float) -> str:
    if fig == "prefill":
        return f"{e.name} " + " ".join(f"{v:.2f}" for v in e.results[fig]) + " s"
    return f"{e.name} q{q:g} {e.best(fig, q):.1f}, median {e.best(fig, 0.5):.1f} tok/s"


def fmt(x: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else format(x, f"{width}{spec}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="default: float32,bfloat16")
    ap.add_argument("--engines", help="pdtop, hf, llamacpp (default: pdtop and the peers installed)")
    ap.add_argument("--only", default=",".join(FIGURES), help="figures to measure (default: b1,b32,prefill)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per turn (default 32)")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of the decode runs (default 32)")
    ap.add_argument("--prefill-tokens", type=int, default=2048, help="default 2048")
    ap.add_argument("--repeats", type=int, default=3, help="turns per figure and engine (default 3)")
    ap.add_argument("--quantile", type=float, default=0.1, help="decode step-time quantile reported (default 0.1)")
    ap.add_argument("--llamacpp-wait", choices=("own", "shared"), default="own",
                    help="llama.cpp's OpenMP wait: own (its process, libgomp's spinning default; default) or "
                         "shared (pdtop's OMP_WAIT_POLICY)")
    ap.add_argument("--in-turns", action="store_true",
                    help="load every dtype's engines at once and measure all of them in turns (more memory)")
    args = ap.parse_args()
    names = chosen_engines(args.engines)
    if isinstance(names, str):
        print(f"engine_bench: {names}", file=sys.stderr)
        return 2
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    figures = [f for f in FIGURES if f in args.only.split(",")]
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    table: list[Engine] = []
    groups = [args.dtypes.split(",")] if args.in_turns else [[d] for d in args.dtypes.split(",")]
    for dtypes in groups:
        engines: list[Engine] = []
        for dtype in dtypes:
            for name in names:
                if not measured_with(name, dtype, args.dtypes.split(",")):
                    continue
                try:
                    engines.append(ENGINES[name](dtype, args))
                except ImportError as exc:
                    table.append(Engine(name, dtype, note=f"not installed ({exc.name}); pip install '.[peers]'"))
                except Exception as exc:  # a peer that cannot load is reported, not fatal
                    table.append(Engine(name, dtype, note=f"failed: {type(exc).__name__}: {exc}"[:100]))
        for fig in figures:
            for e in engines:  # warm-up turn, not counted
                run_turn(e, fig)
                e.results[fig].clear()
            for _ in range(args.repeats):
                for e in engines:
                    run_turn(e, fig)
            print(f"  {fig}: " + "; ".join(f"{e.dtype} {progress(e, fig, args.quantile)}" for e in engines),
                  file=sys.stderr, flush=True)
        table.extend(engines)
        del engines
        gc.collect()
    from pdtop.engine.model import cpu_kernels

    waits = ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ)
    print(f"load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f} (1 min); OpenMP: {waits or 'defaults'}; "
          f"pdtop decode attention: {'C kernel' if cpu_kernels.decode_attention() else 'torch SDPA'}")
    print(f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cores; "
          f"decode: {args.prompt_tokens}-token prompts, {args.steps} steps x {args.repeats} turns, "
          f"tok/s at the q{args.quantile:g} step time; prefill: {args.prefill_tokens} tokens, best of {args.repeats}")
    prefill = f"prefill {args.prefill_tokens} s"
    head = f"{'engine':14} {'dtype':9} {'decode b1 tok/s':>16} {'decode b32 tok/s':>17} {prefill:>14}  note"
    print(head)
    print("-" * len(head))
    q = args.quantile
    for e in table:
        print(f"{e.name:14} {e.dtype:9} {fmt(e.best('b1', q), '.1f', 16)} {fmt(e.best('b32', q), '.1f', 17)} "
              f"{fmt(e.best('prefill'), '.2f', 14)}  {e.note}")
    by = {(e.name, e.dtype): e for e in table}

    def ratio(a: float | None, b: float | None, width: int) -> str:
        return f"{a / b:{width - 1}.2f}x" if a and b else f"{'-':>{width}}"
    for peer in ("hf", "llamacpp"):
        for dtype in args.dtypes.split(","):
            p, h = by.get(("pdtop", dtype)), by.get((peer, dtype))
            if p and h:
                label = f"pdtop/{peer}"
                print(f"{label:14} {dtype:9} {ratio(p.best('b1', q), h.best('b1', q), 16)} "
                      f"{ratio(p.best('b32', q), h.best('b32', q), 17)} "
                      f"{ratio(h.best('prefill'), p.best('prefill'), 14)}  (prefill: {peer} time / pdtop time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
