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

With --url http://HOST:PORT (or vLLM's --base-url, --host/--port) it is `vllm bench serve`'s client
instead (vLLM 0.33's options): a seeded random load, or a ShareGPT JSON or a JSONL of prompts
(--dataset-name), sent as streaming completions or chat completions (--backend) to any
OpenAI-compatible server (pdtop serve --api-port, vLLM, SGLang) after an uncounted warm-up, at
--request-rate with gamma arrivals (--burstiness) or a ramp-up; it prints vLLM's table (throughput,
goodput, TTFT, TPOT, ITL, E2EL) and --save-result writes vLLM's result JSON (docs/bench_url.md).
Ctrl+C reports what finished and exits 130. The policy comparison's options and the load
generator's are refused in the other mode.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import asdict
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pdtop.bench import serve_client
from pdtop.commands.common import (
    INPUT_ERRORS,
    add_level_rule_arguments,
    add_runtime_arguments,
    fail,
    runtime_options,
    with_level_rule,
)
from pdtop.engine.devices.host import machine, machine_line
from pdtop.engine.scheduling.policies import POLICIES
from pdtop.json_text import json_text

if TYPE_CHECKING:
    from pdtop.bench.policy_bench import PolicyRun, Scenario
    from pdtop.engine.engine import Engine


def add_arguments(p: argparse.ArgumentParser) -> None:
    first = len(p._actions)
    p.add_argument("--policy", choices=(*POLICIES, "all"), default=None, help="policy to run (default: all of them)")
    p.add_argument("--device", default=None, help="cpu, cuda, or sim:GPU (default: sim:H100)")
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
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write one JSON line per measured decode step (level, cores, what prefill ran, GC) "
                        "and print which of these the slowest steps share")
    add_runtime_arguments(p)
    add_level_rule_arguments(p, slo_flag=False)
    engine = p._actions[first:]
    p.add_argument("--model", default=None,
                   help="GGUF path or synthetic:NAME (default: the device's default); with --url the served "
                        "model's name (default: the first the server lists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (with the scenario)")
    url = serve_client.add_arguments(p)
    p.set_defaults(_engine_options=engine, _url_options=url)


def _given(args: argparse.Namespace, actions: list[argparse.Action]) -> str | None:
    """The first of these options given a value other than its default."""
    return next((a.option_strings[0] for a in actions if getattr(args, a.dest) != a.default), None)


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
    if serve_client.url_mode(args):
        flag = _given(args, args._engine_options)
        if flag:
            return fail("bench", f"{flag} is the policy comparison's; with a server to send to, bench is the load "
                                 "generator (docs/bench_url.md)")
        return serve_client.run(args)
    flag = _given(args, args._url_options)
    if flag:
        return fail("bench", f"{flag} is the load generator's: name a server with --url (or --base-url, "
                             "--host/--port)")
    args.policy, args.device = args.policy or "all", args.device or "sim:H100"
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
