"""Compare scheduling policies on a fixed, seeded workload: long prompts arrive one after another
while a decode batch is running. Reports, per policy, TTFT p50/max of the long prompts, decode ITL
p50/p99/max while they prefill, and interference: each ITL divided by the decode-only step time of
the same batch at the same contexts, replayed on the whole device right after (p50/p99; see
docs/levels.md). `--device sim:H100` runs the seed's scenario (32 requests decoding at context 2048,
8192-token prompts) on the simulated GPU; `--device cpu` runs the real model on this machine's cores
(8 requests decoding, eight 1024-token prompts). `disagg` runs a prefill and a decode instance
with their own KV pools, the KV over --link (two simulated GPUs on sim:, two core sets on cpu);
each result says how many devices it used and gives output tokens/s and goodput (the output of
the requests that met --slo-itl-ms / --slo-ttft-ms) per device. Progress goes to stderr: a bar
with an ETA on a terminal, a line per stage otherwise. --quick runs a smaller scenario (about a
minute on a 2-core cpu).

With --url http://HOST:PORT/v1 it is a load generator instead, as vllm bench serve: a seeded
random load, or a ShareGPT JSON or a JSONL of {"prompt", "output_len"} (--dataset-name), sent as
streaming requests to any OpenAI-compatible server (pdtop serve --api-port, vLLM, SGLang) after
one uncounted warm-up request, at --request-rate with gamma arrivals (--burstiness); it prints
vLLM's table (throughput, goodput, TTFT, TPOT, ITL, E2EL) and --save-result writes vLLM's result
JSON (docs/bench_url.md). Ctrl+C reports what finished and exits 130.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
from dataclasses import asdict
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pdtop.bench.datasets import add_dataset_arguments, dataset_problem, dataset_prompts
from pdtop.bench.vllm_result import DEFAULT_PERCENTILE_METRICS, PERCENTILE_METRICS
from pdtop.commands.common import (
    INPUT_ERRORS,
    add_level_rule_arguments,
    add_runtime_arguments,
    fail,
    json_text,
    runtime_options,
    with_level_rule,
)
from pdtop.engine.devices.host import machine, machine_line
from pdtop.engine.scheduling.policies import POLICIES

if TYPE_CHECKING:
    from pdtop.bench.loadgen import LoadSpec, Prompt, RequestResult
    from pdtop.bench.policy_bench import PolicyRun, Scenario
    from pdtop.engine.engine import Engine
    from pdtop.engine.model.tokenizer import Tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=(*POLICIES, "all"), default="all", help="policy to run (default: all of them)")
    p.add_argument("--device", default="sim:H100", help="cpu, cuda, or sim:GPU (default: sim:H100)")
    p.add_argument("--model", default=None, help="GGUF path or synthetic:NAME (default: the device's default)")
    p.add_argument("--config", default=None, help="SGLang-compatible pdmux YAML")
    p.add_argument("--decode-bs", type=int, default=None, help="requests decoding when the long prompts arrive")
    p.add_argument("--long-tokens", type=int, default=None, help="tokens in each long prompt")
    p.add_argument("--long-prompts", type=int, default=None, help="how many long prompts arrive (one after another)")
    p.add_argument("--slo-itl-ms", type=float, default=None, metavar="MS",
                   help="goodput: a request's ITL p99 target, and the SLO --level-rule slo meets "
                        "(default: 20 on sim:, 250 on cpu)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, metavar="MS",
                   help="goodput: a long prompt's TTFT target (default: 1000 on sim:, 5000 on cpu)")
    p.add_argument("--quick", action="store_true",
                   help="a smaller scenario that finishes in about a minute on a 2-core cpu (2 long prompts; "
                        "on cpu 4 decoding requests and 512-token prompts); the other options still apply")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (with the scenario)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write one JSON line per measured decode step (level, cores, what prefill ran, GC) "
                        "and print which of these the slowest steps share")
    add_runtime_arguments(p)
    add_level_rule_arguments(p, slo_flag=False)
    _add_url_arguments(p)


def _table(results: dict[str, dict], head: str, slo: tuple[float, float]) -> str:
    cols = (f"{'policy':<14}{'TTFT p50':>9}{'max':>8}{'ITL p50':>9}{'p99':>7}{'max':>8}{'base p50':>9}"
            f"{'intf p50':>9}{'p99':>7}{'cores':>7}{'cont p50':>9}{'p99':>7}{'out tok/s':>10}{'devices':>8}"
            f"{'/device':>9}{'goodput/dev':>12}")
    lines = [head, cols]
    for policy, r in results.items():
        t, i, b = r["ttft_ms"], r["itl_ms"], r["baseline_ms"]
        x, c, k = r["interference"], r["fewer_cores"], r["contention"]
        lines.append(f"{policy:<14}{t['p50']:>9.1f}{t['max']:>8.1f}{i['p50']:>9.1f}{i['p99']:>7.1f}{i['max']:>8.1f}"
                     f"{b['p50']:>9.1f}{x['p50']:>8.2f}x{x['p99']:>6.2f}x{c['p50']:>6.2f}x{k['p50']:>8.2f}x"
                     f"{k['p99']:>6.2f}x{r['output_tok_s']:>10.1f}{r['devices']:>8}{r['output_tok_s_per_device']:>9.1f}"
                     f"{r['goodput_tok_s_per_device']:>12.1f}")
    lines.append("ms unless noted. base: the same batch decode-only on the whole device; intf: ITL / base; "
                 "cores: decode-only on the step's own cores / base; cont: ITL / that (docs/levels.md);\n"
                 "/device: out tok/s per device used (disagg: 2); goodput/dev: out tok/s of the requests that met "
                 f"the SLOs (ITL p99 <= {slo[0]:g} ms, long prompts' TTFT <= {slo[1]:g} ms), per device")
    return "\n".join(lines)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> int:
    if args.url:
        return _run_url(args)
    from dataclasses import replace

    from pdtop.bench.policy_bench import QUICK, SCENARIOS, Observer, run_bench
    from pdtop.bench.round_trace import RoundTracer
    from pdtop.engine.build import build_engine, parse_device
    from pdtop.engine.runtime.heap import freeze_startup_heap
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config

    def make_engine(policy: str) -> Engine:
        progress.starting(policy)
        engine = build_engine(args.device, args.model, config, policy, seed=args.seed, **options)
        args.weights = (engine.describe().runtime or {}).get("weights", "")  # the header says what ran
        freeze_startup_heap()
        return engine

    try:
        kind = parse_device(args.device).kind
        sc = QUICK[kind] if args.quick else SCENARIOS[kind]
        for name in ("decode_bs", "long_tokens", "long_prompts", "slo_itl_ms", "slo_ttft_ms"):
            value = getattr(args, name)
            if value is not None:
                if not value >= 1 or value == float("inf"):
                    return fail("bench", f"--{name.replace('_', '-')} must be >= 1")
                sc = replace(sc, **{name: value})
        options = runtime_options(args)  # a bad --link: one line before any engine starts
        policies = list(POLICIES) if args.policy == "all" else [args.policy]
        rule = argparse.Namespace(level_rule=args.level_rule,  # --level-rule slo meets the goodput's ITL SLO
                                  slo_itl_ms=sc.slo_itl_ms if args.level_rule == "slo" else args.slo_itl_ms)
        config = with_level_rule(load_pdmux_config(args.config) if args.config else PdmuxConfig(), rule)
        load_before = _loadavg()
        runs: dict[str, PolicyRun] = {}
        interrupted = False
        progress = BenchProgress(policies, 1 + sc.long_prompts)
        try:
            with progress:
                run_bench(make_engine, policies, sc, progress, RoundTracer if args.trace else Observer, runs)
        except KeyboardInterrupt:  # Ctrl+C: report the policies that finished
            interrupted = True
    except INPUT_ERRORS as exc:
        return fail("bench", exc)
    if interrupted:
        if not runs:
            print("pdtop bench: interrupted before a policy finished", file=sys.stderr)
            return 128 + signal.SIGINT
        _report(args, sc, runs, load_before)
        print(f"pdtop bench: interrupted: {len(runs)} of {len(policies)} policies finished; "
              "the figures above are theirs", file=sys.stderr)
        return 128 + signal.SIGINT
    return _report(args, sc, runs, load_before)


def _report(args: argparse.Namespace, sc: Scenario, runs: dict[str, PolicyRun], load_before: list[float]) -> int:
    """Print the finished policies' figures (a table, or --json's object) and write --trace."""
    from pdtop.bench.policy_bench import trace_rows
    from pdtop.bench.round_trace import slow_step_report

    load = {"before": load_before, "after": _loadavg()}
    results = {p: {k: v for k, v in r.summary.items() if k != "decode_units"} for p, r in runs.items()}
    if args.trace:
        rows = [row for p, r in runs.items() for row in trace_rows(p, r.steps)]
        with open(args.trace, "w") as f:
            f.writelines(json_text(row) + "\n" for row in rows)
    if args.json:
        print(json_text({"device": args.device, "machine": machine(), "scenario": asdict(sc), "loadavg": load,
                         "results": results}))
        return 0
    weights = f" ({args.weights})" if getattr(args, "weights", "") else ""  # sim: devices have none
    head = (f"pdtop bench on {args.device}{weights}: {sc.decode_bs} requests decoding "
            f"({sc.decode_prompt}-token prompts), {sc.long_prompts} prompts of {sc.long_tokens} tokens "
            "one after another; "
            f"load average {load['before'][0]:.2f} -> {load['after'][0]:.2f}\n{machine_line()}")
    print(_table(results, head, (sc.slo_itl_ms, sc.slo_ttft_ms)))
    if args.trace:
        print(f"\nslow steps (trace: {args.trace})")
        print(slow_step_report(rows, sc.long_tokens))
    return 0


# ---- the progress bar on stderr ------------------------------------------------------------
# A rich bar with an ETA on a terminal, plain lines otherwise. Each policy has `1 + long_prompts`
# stages (its decode batch running, then each long prompt); `run_bench` says one message per stage.

class BenchProgress:
    """Use as a context manager; `starting(policy)` before an engine is built, `__call__(message)`
    for each stage `run_bench` reports."""

    def __init__(self, policies: list[str], stages_per_policy: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self._bar = Progress(TextColumn("bench {task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                             disable=not self.live)
        self._task = self._bar.add_task("starting", total=len(policies) * stages_per_policy)

    def __enter__(self) -> BenchProgress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.stop()

    def starting(self, policy: str) -> None:
        """An engine is being built (the first loads the model): said at once on the bar (not in the
        plain lines, where an error about the engine is then the only line)."""
        if self.live:
            self._bar.update(self._task, description=f"{policy}: starting the engine")

    def __call__(self, message: str) -> None:
        self._bar.advance(self._task)
        self._say(message)

    def _say(self, message: str) -> None:
        if self.live:
            self._bar.update(self._task, description=message.split(":")[0] + ": " + _stage(message))
            self._bar.console.print(f"bench {message}", style="dim", highlight=False)
        else:
            print(f"bench {message}", file=sys.stderr, flush=True)


def _stage(message: str) -> str:
    """The short stage name for the bar (`long prompt 3/8`)."""
    parts = message.split(": ")
    return parts[1] if len(parts) > 1 else message


# ---- --url: the load generator against any OpenAI-compatible server -------------------------
# The seeded load of `pdtop.bench.loadgen` with vllm bench serve's options and figures. A progress bar
# runs on stderr; `--json` prints one object with the scenario. An API key comes from $OPENAI_API_KEY.

def _add_url_arguments(p: argparse.ArgumentParser) -> None:
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


def _check_url(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, if anything."""
    from pdtop.bench.loadgen import SLO_METRICS

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
    from pdtop.bench.loadgen import LoadSpec

    goodput = {name: float(ms) for name, _, ms in (item.partition(":") for item in args.goodput)}
    return LoadSpec(url=args.url.rstrip("/"), model=args.model, num_prompts=args.num_prompts,
                    request_rate=args.request_rate, max_concurrency=args.max_concurrency,
                    input_len=args.random_input_len, output_len=args.random_output_len,
                    range_ratio=args.random_range_ratio, seed=args.seed, ignore_eos=args.ignore_eos,
                    goodput=goodput, burstiness=args.burstiness, warmup=args.warmup)


def _prompts(args: argparse.Namespace, spec: LoadSpec, tokenizer: Tokenizer) -> list[Prompt]:
    from pdtop.bench.loadgen import make_prompts
    from pdtop.engine.scheduling.workload import corpus_text

    if args.dataset_name != "random":
        return list(dataset_prompts(args, tokenizer, spec.num_prompts, spec.seed))
    return list(make_prompts(spec, tokenizer.encode(corpus_text()), tokenizer.decode))


def _run_url(args: argparse.Namespace) -> int:
    import httpx

    from pdtop.bench.loadgen import LoadRun, WarmupFailed, run_load
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer

    problem = _check_url(args)
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
    code = _report_url(args, spec, results, duration, tokenizer_path)
    if interrupted:
        print(f"pdtop bench: interrupted: {len(results)} of {len(prompts)} requests finished; "
              "the figures above are theirs", file=sys.stderr)
        return 130
    return code


def _report_url(args: argparse.Namespace, spec: LoadSpec, results: list[RequestResult], duration: float,
                tokenizer_id: str) -> int:
    """Print the figures (vLLM's table, or pdtop's --json object), write vLLM's result JSON if asked."""
    from datetime import datetime

    from pdtop.bench.loadgen import summarize
    from pdtop.bench.vllm_result import result_filename, result_json, result_table

    metrics = tuple(args.percentile_metrics.split(","))
    percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    summary = summarize(spec, results, duration)
    result = result_json(spec, results, duration, date=datetime.now().strftime("%Y%m%d-%H%M%S"),
                         tokenizer_id=tokenizer_id, label=args.label, metrics=metrics, percentiles=percentiles,
                         detailed=args.save_detailed)
    print(json_text(summary) if args.json else result_table(result, metrics, percentiles), flush=True)
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
