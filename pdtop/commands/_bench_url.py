"""`pdtop bench --url http://HOST:PORT/v1`: the seeded load of `pdtop.analysis.loadgen` against any
OpenAI-compatible server, with vllm bench serve's options and figures. A progress bar runs on stderr;
`--json` prints one object with the scenario. An API key comes from $OPENAI_API_KEY."""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from typing import TYPE_CHECKING

from pdtop.analysis.serve_result import DEFAULT_PERCENTILE_METRICS, PERCENTILE_METRICS
from pdtop.commands._common import INPUT_ERRORS, fail
from pdtop.commands._datasets import add_dataset_arguments, dataset_problem, dataset_prompts
from pdtop.telemetry.encode import encode

if TYPE_CHECKING:
    from pdtop.analysis.loadgen import LoadSpec, Prompt, RequestResult
    from pdtop.engine.model.tokenizer import Tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load generator (with --url; vllm bench serve's options)")
    g.add_argument("--url", metavar="http://HOST:PORT/v1",
                   help="send the load to this OpenAI-compatible server instead of comparing policies; "
                        "--model then names the served model (default: the first it lists)")
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second; inf sends all at once (default inf)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps between arrivals: 1 is Poisson, < 1 burstier, > 1 more even "
                        "(default 1; only with a finite --request-rate)")
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    g.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="do not send the first prompt once, uncounted, before the clock starts")
    add_dataset_arguments(g)
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    g.add_argument("--random-output-len", type=int, default=128, help="max_tokens per request (default 128)")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)] (default 0: fixed)")
    g.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM's ignore_eos)")
    g.add_argument("--goodput", nargs="+", metavar="METRIC:MS", default=[],
                   help="SLOs for goodput: ttft:MS, tpot:MS, e2el:MS")
    g.add_argument("--percentile-metrics", default=DEFAULT_PERCENTILE_METRICS,
                   help=f"metrics to report statistics of, from {','.join(PERCENTILE_METRICS)} "
                        f"(default {DEFAULT_PERCENTILE_METRICS})")
    g.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default 99)")
    g.add_argument("--save-result", action="store_true", help="write vLLM's result JSON")
    g.add_argument("--save-detailed", action="store_true",
                   help="with the per-request arrays (input_lens, output_lens, ttfts, itls, generated_texts, ...)")
    g.add_argument("--result-dir", metavar="DIR", help="where to write it (default: the current directory)")
    g.add_argument("--result-filename", metavar="NAME",
                   help="its name (default: vLLM's {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json)")
    g.add_argument("--label", help="the result's label and file name prefix (default: openai)")
    g.add_argument("--tokenizer", metavar="GGUF", help="GGUF whose tokenizer cuts the prompts (default SmolLM2)")


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, if anything."""
    from pdtop.analysis.loadgen import SLO_METRICS

    if not args.url.startswith(("http://", "https://")):
        return f"--url must be http://HOST:PORT/v1, got {args.url!r}"
    for name in ("random_input_len", "random_output_len", "max_concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    if not args.request_rate > 0:
        return f"--request-rate must be > 0 (or inf), got {args.request_rate}"
    if not args.burstiness > 0:
        return f"--burstiness must be > 0, got {args.burstiness}"
    if not 0 <= args.random_range_ratio < 1:
        return f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}"
    problem = dataset_problem(args)
    if problem:
        return problem
    metrics = args.percentile_metrics.split(",")
    if not all(m in PERCENTILE_METRICS for m in metrics):
        return f"--percentile-metrics takes names from {','.join(PERCENTILE_METRICS)}, got {args.percentile_metrics!r}"
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    except ValueError:
        percentiles = [-1.0]
    if not all(0 < p <= 100 for p in percentiles):
        return f"--metric-percentiles takes numbers in (0, 100], got {args.metric_percentiles!r}"
    for item in args.goodput:
        name, _, ms = item.partition(":")
        try:
            ok = name in SLO_METRICS and float(ms) >= 0
        except ValueError:
            ok = False
        if not ok:
            return f"--goodput takes METRIC:MS with METRIC one of {', '.join(SLO_METRICS)}, got {item!r}"
    return None


def _spec(args: argparse.Namespace) -> LoadSpec:
    from pdtop.analysis.loadgen import LoadSpec

    goodput = {name: float(ms) for name, _, ms in (item.partition(":") for item in args.goodput)}
    return LoadSpec(url=args.url.rstrip("/"), model=args.model, num_prompts=args.num_prompts,
                    request_rate=args.request_rate, max_concurrency=args.max_concurrency,
                    input_len=args.random_input_len, output_len=args.random_output_len,
                    range_ratio=args.random_range_ratio, seed=args.seed, ignore_eos=args.ignore_eos,
                    goodput=goodput, burstiness=args.burstiness, warmup=args.warmup)


def _prompts(args: argparse.Namespace, spec: LoadSpec, tokenizer: Tokenizer) -> list[Prompt]:
    from pdtop.analysis.loadgen import make_prompts
    from pdtop.engine.scheduling.workload import corpus_text

    if args.dataset_name != "random":
        return list(dataset_prompts(args, tokenizer, spec.num_prompts, spec.seed))
    return list(make_prompts(spec, tokenizer.encode(corpus_text()), tokenizer.decode))


def run(args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pdtop.analysis.loadgen import LoadRun, WarmupFailed, run_load
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer

    problem = _check(args)
    if problem:
        return fail("bench", problem)
    spec = _spec(args)
    try:
        tokenizer_path = str(args.tokenizer or default_model_path())
        tokenizer = Tokenizer.from_gguf(tokenizer_path)
        prompts = _prompts(args, spec, tokenizer)
        if args.save_result and args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
    except INPUT_ERRORS as exc:
        return fail("bench", exc)
    except ValueError as exc:  # a dataset that is not what it should be
        return fail("bench", exc)
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    columns = (TextColumn("pdtop bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    record = LoadRun()
    results: list[RequestResult] = []
    duration, interrupted, problem = 0.0, False, ""
    console = Console(stderr=True)
    with Progress(*columns, transient=True, console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("requests", total=len(prompts))
        try:
            results, duration = asyncio.run(run_load(spec, prompts, headers, lambda _: progress.advance(bar), record))
        except WarmupFailed as exc:
            problem = f"the warm-up request to {args.url} failed: {exc}"
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
            problem = f"cannot use {args.url}: {type(exc).__name__}: {exc}"
        except KeyboardInterrupt:
            results, duration, interrupted = record.finished(), record.duration(), True
    if problem:  # after the bar is gone, so the line is the only one
        return fail("bench", problem)
    if interrupted and not results:
        when = "during the warm-up request" if record.start is None else "before any request finished"
        print(f"pdtop bench: interrupted {when}", file=sys.stderr)
        return 130
    code = _report(args, spec, results, duration, tokenizer_path)
    if interrupted:
        print(f"pdtop bench: interrupted: {len(results)} of {len(prompts)} requests finished; "
              "the figures above are theirs", file=sys.stderr)
        return 130
    return code


def _report(args: argparse.Namespace, spec: LoadSpec, results: list[RequestResult], duration: float,
            tokenizer_id: str) -> int:
    """Print the figures (vLLM's table, or pdtop's --json object), write vLLM's result JSON if asked."""
    from datetime import datetime

    from pdtop.analysis.loadgen import summarize
    from pdtop.analysis.serve_result import result_filename, result_json, result_table

    metrics = tuple(args.percentile_metrics.split(","))
    percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    summary = summarize(spec, results, duration)
    result = result_json(spec, results, duration, date=datetime.now().strftime("%Y%m%d-%H%M%S"),
                         tokenizer_id=tokenizer_id, label=args.label, metrics=metrics, percentiles=percentiles,
                         detailed=args.save_detailed)
    print(encode(summary) if args.json else result_table(result, metrics, percentiles), flush=True)
    if args.save_result:
        path = result_filename(result, args.result_filename, args.result_dir)
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(result, f)
        except OSError as exc:
            return fail("bench", f"cannot write the result to {path}: {exc.strerror or exc}")
    if not summary["completed"]:
        print(f"pdtop bench: error: no request completed: {'; '.join(summary['errors'])}", file=sys.stderr)
        return 1
    return 0
