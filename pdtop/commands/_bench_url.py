"""`pdtop bench --url http://HOST:PORT/v1`: the seeded load of `pdtop.analysis.loadgen` against any
OpenAI-compatible server, with vllm bench serve's options and figures. A progress bar runs on stderr;
`--json` prints one object with the scenario. An API key comes from $OPENAI_API_KEY."""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from typing import TYPE_CHECKING

from pdtop.commands._common import INPUT_ERRORS, fail
from pdtop.telemetry.encode import encode

if TYPE_CHECKING:
    from pdtop.analysis.loadgen import LoadSpec


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load generator (with --url; vllm bench serve's options)")
    g.add_argument("--url", metavar="http://HOST:PORT/v1",
                   help="send the load to this OpenAI-compatible server instead of comparing policies; "
                        "--model then names the served model (default: the first it lists)")
    g.add_argument("--num-prompts", type=int, default=1000, help="requests to send (default 1000)")
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second, Poisson arrivals; inf sends all at once (default inf)")
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    g.add_argument("--random-output-len", type=int, default=128, help="max_tokens per request (default 128)")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)] (default 0: fixed)")
    g.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM's ignore_eos)")
    g.add_argument("--goodput", nargs="+", metavar="METRIC:MS", default=[],
                   help="SLOs for goodput: ttft:MS, tpot:MS, e2el:MS")
    g.add_argument("--tokenizer", metavar="GGUF", help="GGUF whose tokenizer cuts the prompts (default SmolLM2)")


def _spec(args: argparse.Namespace) -> LoadSpec | str:
    """The scenario, or what is wrong with the options."""
    from pdtop.analysis.loadgen import SLO_METRICS, LoadSpec

    if not args.url.startswith(("http://", "https://")):
        return f"--url must be http://HOST:PORT/v1, got {args.url!r}"
    for name in ("num_prompts", "random_input_len", "random_output_len", "max_concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    if not args.request_rate > 0:
        return f"--request-rate must be > 0 (or inf), got {args.request_rate}"
    if not 0 <= args.random_range_ratio < 1:
        return f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}"
    goodput = {}
    for item in args.goodput:
        name, _, ms = item.partition(":")
        try:
            goodput[name] = float(ms)
        except ValueError:
            name = ""
        if name not in SLO_METRICS or not goodput[name] > 0:
            return f"--goodput takes METRIC:MS with METRIC one of {', '.join(SLO_METRICS)}, got {item!r}"
    return LoadSpec(url=args.url.rstrip("/"), model=args.model, num_prompts=args.num_prompts,
                    request_rate=args.request_rate, max_concurrency=args.max_concurrency,
                    input_len=args.random_input_len, output_len=args.random_output_len,
                    range_ratio=args.random_range_ratio, seed=args.seed, ignore_eos=args.ignore_eos,
                    goodput=goodput)


def run(args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pdtop.analysis.loadgen import make_prompts, run_load, summarize, table
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.engine.scheduling.workload import corpus_text

    spec = _spec(args)
    if isinstance(spec, str):
        return fail("bench", spec)
    try:
        tokenizer = Tokenizer.from_gguf(args.tokenizer or default_model_path())
        prompts = make_prompts(spec, tokenizer.encode(corpus_text()), tokenizer.decode)
    except INPUT_ERRORS as exc:
        return fail("bench", exc)
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    columns = (TextColumn("pdtop bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, console=Console(stderr=True)) as progress:
        bar = progress.add_task("requests", total=len(prompts))
        try:
            results, duration = asyncio.run(run_load(spec, prompts, headers, lambda _: progress.advance(bar)))
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            return fail("bench", f"cannot use {args.url}: {type(exc).__name__}: {exc}")
    summary = summarize(spec, results, duration)
    print(encode(summary) if args.json else table(summary))
    if not summary["completed"]:
        print(f"pdtop bench: error: no request completed: {'; '.join(summary['errors'])}", file=sys.stderr)
        return 1
    return 0

