"""Find the PD multiplexing configuration (SGLang's sm_group_num, manual_divisions,
split_forward_token_budget, decode_bs_divisor; with --sglang-version main also
max_split_forward_layers and overlap_decode_full_sm) that meets the SLOs with the best goodput, for a
device, model and workload, and write it as the --pdmux-config-path YAML that SGLang reads.

Each candidate runs `pdtop bench`'s seeded scenario (requests decoding while long prompts arrive
one after another; --workload changes it) and is measured for ITL p99, TTFT p99, prefill
throughput (prompt tokens/s while prompts wait) and goodput (requests/s that meet every SLO).
The search is adaptive (Optuna's TPE, starting from SGLang's default and the roofline's guess; knobs
whose effect is within the noise stop varying; docs/tune.md). Printed: the candidates, which knobs
mattered, the front (ITL p99 against prefill throughput) as a table and a plot, and the chosen
configuration against SGLang's default on the same workload. Exit status 1 when no configuration
meets the SLOs (the closest are shown), 2 for bad input (an ITL SLO below what decode alone
achieves too).

On sim: devices the search runs in seconds; on cpu and cuda it runs real rounds, shows each
candidate as it goes and stops at --budget-s.

Examples:
  pdtop tune --slo-itl-ms 10.25 --out best.yaml      (then: pdtop --config best.yaml)
  pdtop tune --device sim:H200 --slo-itl-ms 8 --slo-ttft-ms 600 --json
  pdtop tune --device sim:H100 --slo-itl-ms 14 --workload decode_bs=64,long_tokens=16384 --budget-s 10
  pdtop tune --slo-itl-ms 12 --sglang-version main --budget-s 20
  pdtop tune --device cpu --slo-itl-ms 400 --budget-s 10
  pdtop tune --slo-itl-ms 20 --slo-ttft-ms 1000 --policies pdmux,chunked,disagg --link rdma100 --budget-s 20
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from pdtop.bench.datasets import add_dataset_arguments, dataset_options, dataset_problem, dataset_prompts
from pdtop.commands.common import INPUT_ERRORS, cuda_missing, fail, positive_number
from pdtop.engine.errors import DeviceError, EngineError, FieldError
from pdtop.engine.scheduling.pdmux_config import SGLANG_MAIN, SGLANG_RELEASE, SGLANG_TARGETS
from pdtop.json_text import json_text
from pdtop.plain_yaml import YamlError, read_yaml
from pdtop.typed_json import show, show_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdtop.bench.policy_bench import Scenario
    from pdtop.engine.engine import Engine
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.tune.http_workload import DatasetTraffic
    from pdtop.tune.report import TuneReport
    from pdtop.tune.score import Measurement, Slo
    from pdtop.tune.search import Trial
    from pdtop.tune.server_search import LaunchReport, Outcome

SIM_BUDGET_S, REAL_BUDGET_S = 60.0, 300.0
WORKLOAD_KEYS = ("decode_bs", "decode_prompt", "long_tokens", "long_prompts", "settle_rounds", "decode_tokens")
BAD_INPUT: tuple[type[BaseException], ...] = (*INPUT_ERRORS, ValueError)  # ValueError: a bad --policies
LAUNCH_HELP = """\
--launch runs each candidate on a server started for it, as vLLM's benchmarks/auto_tune does, or
sets it live on the one running: CMD is split into words as a shell would, and {config} (the
candidate's YAML), {port} and {control_port} (free loopback ports) are filled into each word as one
argument, no shell reading them. With {control_port} (pdtop serve --port, or SGLang with pdtop's plugin:
PDTOP_SGLANG_PORT={control_port}), a candidate with the running server's SM counts is set on it live
over pdtop's websocket protocol; only other SM counts start a new server. A server runs in its own
process group, is ready when /health and then /v1/models answer 200 (within --startup-timeout), gets
one uncounted warm-up request, then the workload over its OpenAI API (decode_bs streaming requests
decoding while long prompts arrive one after another, or at --request-rate; or, with --dataset-path,
the dataset's requests as `pdtop bench --url` reads and sends them: --dataset-name sharegpt|custom,
--num-prompts of them in seeded order, at --request-rate per second, Poisson, default all at once,
each with ignore_eos), and is stopped (SIGTERM to the group, SIGKILL after 10 s, until the port is
free). No server outlives pdtop: not on success, error, Ctrl+C or SIGTERM. A request is good, as
`vllm bench serve --goodput ttft:MS tpot:MS` counts it, when its TTFT meets --slo-ttft-ms and its TPOT
(not its p99 gap) meets --slo-itl-ms. With {control_port}, the server's decode rounds are also read over
that port (read-only) during each candidate's window, and the configuration's ITL p99, which the SLO
is held against, is theirs (each request's gap counted at each round that gave it a token, as pdtop's
own engine counts ITL; the tables say "ITL p99 (rounds)"); without it, or where no round arrives, each
request's TPOT p99 stands in ("TPOT p99", and the report says why once). --device and --model name what
the server runs, for the search space; nothing is loaded here. --results remembers the workload (the
scenario's keys, or the dataset file's SHA-256 and options): a resume with another one is refused; the
search's study is kept beside it (FILE.optuna). SGLang 0.5.23 starts --enable-pdmux only with
--chunked-prefill-size -1 and --disable-overlap-schedule (and no pipeline parallelism or
disaggregation): a command without them is refused before anything is launched.
  pdtop tune --launch 'pdtop serve --device sim:H100 --workload none --port {control_port} --config {config} \\
             --api-port {port}' --device sim:H100 --slo-itl-ms 30 --max-candidates 3 --results runs.jsonl
  pdtop tune --launch 'PDTOP_SGLANG_PORT={control_port} python -m sglang.launch_server --model-path M \\
             --enable-pdmux --pdmux-config-path {config} --chunked-prefill-size -1 --disable-overlap-schedule \\
             --port {port}' --slo-itl-ms 30 --slo-ttft-ms 2000 --budget-s 3600 \\
             --dataset-name sharegpt --dataset-path ShareGPT_V3.json --num-prompts 200 --request-rate 4
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--device", default="sim:H100", help="sim:GPU, cpu or cuda (default: sim:H100)")
    p.add_argument("--model", default=None, help="GGUF path or synthetic:NAME (default: the device's default)")
    p.add_argument("--slo-itl-ms", required=True, metavar="MS",
                   help="ITL p99 target, milliseconds (--launch: the server's rounds with {control_port}, "
                   "else each request's TPOT)")
    p.add_argument("--slo-ttft-ms", metavar="MS", help="TTFT p99 target of the long prompts, milliseconds")
    p.add_argument("--workload", metavar="K=V,...",
                   help=f"change the scenario: {', '.join(WORKLOAD_KEYS)} (or a YAML file of them)")
    p.add_argument("--budget-s", metavar="S",
                   help=f"stop searching after this many seconds (default {SIM_BUDGET_S:g} on sim:, "
                   f"{REAL_BUDGET_S:g} on cpu/cuda, none with --launch); counted from the command's start")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N", help="KV cache size in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE", help="write the chosen configuration as SGLang's pdmux YAML")
    p.add_argument("--sglang-version", default=SGLANG_RELEASE, metavar="V",
                   help=f"the SGLang that reads --out: {SGLANG_RELEASE} (default, the latest release: its four keys "
                   f"and meaning) or {SGLANG_MAIN} (sgl-project/sglang 337ee8ed: also max_split_forward_layers and "
                   "overlap_decode_full_sm); the search covers what it reads")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--policies", metavar="P,...",
                   help="compare the ways instead (pdmux, chunked, prefill-first, disagg): the best configuration "
                        "of each under the SLOs, and goodput per device")
    p.add_argument("--link", metavar="LINK", help="disagg's KV link with --policies (default: rdma400 on sim:, "
                                                   "unpaced copies on cpu)")
    g = p.add_argument_group("launching a server per candidate (--launch)")
    g.add_argument("--launch", metavar="CMD", help="the server's command line, with {config} and {port}")
    g.add_argument("--startup-timeout", metavar="S", default="600",
                   help="seconds a server may take to answer /health and /v1/models (default 600)")
    g.add_argument("--results", metavar="FILE",
                   help="JSON lines of every candidate's outcome; an existing file (same command and workload) "
                   "is reused and the search goes on")
    g.add_argument("--log-dir", metavar="DIR",
                   help="where each candidate's YAML and server log go (default FILE.logs beside --results, "
                   "else a new temporary directory)")
    g.add_argument("--max-candidates", type=int, metavar="N", help="launch at most N servers")
    g.add_argument("--tokenizer", metavar="GGUF", help="a GGUF with the launched model's tokenizer: it cuts the "
                   "prompts to their token counts and applies the chat template (default SmolLM2's)")
    g.add_argument("--request-rate", metavar="R", help="long prompts per second, Poisson (default: one after "
                   "another); with --dataset-path, its requests per second (default inf: all at once)")
    add_dataset_arguments(g, num_prompts=None)
    p.epilog = LAUNCH_HELP


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # importing torch and loading the model count against the budget
    from pdtop.bench.policy_bench import SCENARIOS
    from pdtop.engine.build import parse_device
    from pdtop.tune.engine_search import tune
    from pdtop.tune.score import Slo

    try:
        itl_ms = positive_number("--slo-itl-ms", args.slo_itl_ms)
        ttft_ms = positive_number("--slo-ttft-ms", args.slo_ttft_ms)
        budget = positive_number("--budget-s", args.budget_s)
        if args.kv_tokens is not None and args.kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be >= 1, got {args.kv_tokens}")
        if args.sglang_version not in SGLANG_TARGETS:
            raise ValueError(f"--sglang-version: pdtop knows {SGLANG_RELEASE} (the latest release) and {SGLANG_MAIN} "
                             f"(sgl-project/sglang at 337ee8ed), got {args.sglang_version!r}")
        if args.out and not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK):
            raise ValueError(f"--out {args.out}: its directory does not exist or cannot be written")
    except ValueError as exc:
        return fail("tune", exc)
    assert itl_ms is not None
    slo = Slo(itl_ms / 1e3, None if ttft_ms is None else ttft_ms / 1e3)
    if args.link and not args.policies:
        return fail("tune", "--link applies to disagg: compare the ways with --policies pdmux,chunked,disagg")
    if args.policies and args.launch is not None:
        return fail("tune", "--policies compares the ways on pdtop's own engine; it does not go with --launch")
    if args.launch is None and (args.dataset_path or args.dataset_name != "random" or args.num_prompts is not None
                                or args.tokenizer):
        return fail("tune", "--dataset-path, --dataset-name, --num-prompts and --tokenizer are --launch's traffic "
                    "(a server's OpenAI API); pdtop's own engine runs --workload's scenario")
    if args.policies:
        return _run_policies(args, slo, budget)
    if args.launch is not None:
        return _run_launch(args, slo, budget)
    try:
        where = parse_device(args.device)
        missing = cuda_missing(args.device) if where.kind == "cuda" else None
        if missing:  # one line before anything loads
            raise DeviceError(missing)
        sc = SCENARIOS[where.kind]
        if args.workload:
            sc = parse_workload(args.workload, sc)
        make_engine = _engine_factory(args, where.kind)
        real = where.kind != "sim"
        budget_s = budget or (REAL_BUDGET_S if real else SIM_BUDGET_S)
        report = tune(make_engine, sc, slo, budget_s - (time.monotonic() - started), _progress(budget_s, real, started),
                      args.sglang_version, args.seed)
    except INPUT_ERRORS as exc:
        return fail("tune", exc)
    load = os.getloadavg()
    if args.out and report.best is not None:
        _write(args.out, report, args.device)
    if args.json:
        from pdtop.tune.report import report_json

        out = report_json(report, args.device, load)
        out["out"] = args.out if args.out and report.best is not None else None
        print(json_text(out))
    else:
        print("\n".join(_text(report, args, load)))
    return 0 if report.best is not None else 1


# ---- on pdtop's own engine ------------------------------------------------------------------

def _engine_factory(args: argparse.Namespace, kind: str) -> Callable[[], Engine]:
    """A function that builds a fresh engine with the default configuration; a real model is loaded once."""
    from pdtop.engine.build import build_engine

    loaded = None
    if kind != "sim":
        from pdtop.engine.build import load_for

        loaded = load_for(args.device, args.model)  # the device's default dtype (bfloat16 on cuda)

    def make() -> Engine:
        return build_engine(args.device, args.model, seed=args.seed, kv_capacity_tokens=args.kv_tokens,
                            loaded_model=loaded)

    return make


def _progress(budget_s: float, real: bool, started: float) -> Callable[[Trial, Measurement], None]:
    """Real devices: one line per candidate on stderr. sim: one line rewritten, on a terminal only.
    The seconds shown count from `started`, the command's start, as the budget does."""
    from pdtop.tune.report import describe_config

    count = 0
    tty = sys.stderr.isatty()

    def show(trial: Trial, r: Measurement) -> None:
        nonlocal count
        elapsed = time.monotonic() - started
        count += 1
        line = (f"pdtop tune: [{count}] {elapsed:.0f}/{budget_s:.0f} s  ITL p99 {r.itl_p99_s * 1e3:.2f} ms  "
                f"prefill {r.prefill_tok_s:,.0f} tok/s  goodput {r.goodput_rps:.2f}/s  {describe_config(trial.config)}")
        if real:
            print(line, file=sys.stderr, flush=True)
        elif tty:
            print(f"\r\033[K{line[:150]}", end="", file=sys.stderr, flush=True)

    return show


def _write(path: str, report: TuneReport, device: str) -> None:
    from pdtop.engine.build import parse_device
    from pdtop.tune.report import best_yaml

    with open(path, "w", encoding="utf-8") as f:
        f.write(best_yaml(report, device, parse_device(device).kind))


def _text(report: TuneReport, args: argparse.Namespace, load: tuple[float, float, float]) -> list[str]:
    from pdtop.tune.report import front_and_choice, sglang_name

    sc, slo, run = report.scenario, report.slo, report.run
    if sys.stderr.isatty() and not args.device.startswith(("cpu", "cuda")):
        print(file=sys.stderr)  # end the progress line
    ttft = f", TTFT p99 <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    return [
        f"pdtop tune on {args.device}: {sc.decode_bs} requests decoding ({sc.decode_prompt}-token prompts) while "
        f"{sc.long_prompts} prompts of {sc.long_tokens} tokens arrive; seed {args.seed}",
        f"SLO: ITL p99 <= {slo.itl_s * 1e3:g} ms{ttft}; decode-only ITL "
        f"{report.default.result.decode_only_itl_s * 1e3:.2f} ms",
        f"searched {len(report.trials)} configurations of {report.grid_size:,} grid points (Optuna TPE, for "
        f"{sglang_name(report.space.sglang)}) in {run.elapsed_s:.1f} s"
        f"{'' if run.complete else ', stopped by --budget-s'}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        *front_and_choice(report, args.out),
    ]


# ---- --policies: the ways compared --------------------------------------------------------

def _run_policies(args: argparse.Namespace, slo: Slo, budget: float | None) -> int:
    from pdtop.bench.policy_bench import SCENARIOS
    from pdtop.engine.build import build_engine, load_for, parse_device
    from pdtop.engine.roofline.kv import parse_link
    from pdtop.engine.runtime.kv_link import DEFAULT_SIM_LINK, UNPACED
    from pdtop.engine.scheduling.policies import DISAGG_ON_CUDA
    from pdtop.tune.policy_comparison import compare, parse_policies, table, to_json

    try:
        policies = parse_policies(args.policies or "pdmux,chunked,disagg")
        link = parse_link(args.link, "--link") if args.link else None
        where = parse_device(args.device)
        missing = cuda_missing(args.device) if where.kind == "cuda" else None
        if missing:
            raise DeviceError(missing)
        if where.kind == "cuda" and "disagg" in policies:
            raise DeviceError(DISAGG_ON_CUDA)
        sc = parse_workload(args.workload, SCENARIOS[where.kind]) if args.workload else SCENARIOS[where.kind]
        loaded = load_for(args.device, args.model) if where.kind != "sim" else None

        def make(policy: str) -> Engine:
            return build_engine(args.device, args.model, seed=args.seed, kv_capacity_tokens=args.kv_tokens,
                                loaded_model=loaded, link=link)

        name = link.name if link is not None else DEFAULT_SIM_LINK.name if where.kind == "sim" else UNPACED
        default_budget = REAL_BUDGET_S if where.kind != "sim" else SIM_BUDGET_S
        rows = compare(make, sc, slo, policies, name, budget or default_budget,
                       lambda msg: print(f"pdtop tune: {msg}", file=sys.stderr, flush=True))
    except BAD_INPUT as exc:
        return fail("tune", exc)
    load = os.getloadavg()
    if args.json:
        print(json_text({"device": args.device, "slo": {"itl_ms": slo.itl_s * 1e3,
                                                         "ttft_ms": slo.ttft_s * 1e3 if slo.ttft_s else None},
                         "scenario": vars(sc), "loadavg": list(load), "policies": to_json(rows)}))
    else:
        print(f"pdtop tune --policies on {args.device}: {sc.decode_bs} requests decoding ({sc.decode_prompt}-token "
              f"prompts) while {sc.long_prompts} prompts of {sc.long_tokens} tokens arrive; load average "
              f"{load[0]:.2f}")
        print("\n".join(table(rows, slo)))
    return 0 if any(r.meets for r in rows) else 1


# ---- --launch: a server per candidate -----------------------------------------------------

def _run_launch(args: argparse.Namespace, slo: Slo, budget_s: float | None) -> int:
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.engine.scheduling.workload import corpus_text
    from pdtop.tune.http_workload import launch_scenario, text_prompts
    from pdtop.tune.server_process import check_template, signals_as_exit, substitute
    from pdtop.tune.server_search import LaunchPlan, LaunchRunner, tune_launch
    from pdtop.tune.sglang_server import check_command, rules_line
    from pdtop.tune.space import dataset_space_scenario, device_default, first_guess, space_for_device

    try:
        check_template(args.launch)
        problem = dataset_problem(args)
        if problem:
            raise ValueError(problem)
        if args.num_prompts is not None and not args.dataset_path:
            raise ValueError("--num-prompts counts --dataset-path's requests; the scenario's are --workload's")
        if args.dataset_path and args.workload:
            raise ValueError("--workload shapes the scenario; with --dataset-path the dataset is the workload")
        startup = positive_number("--startup-timeout", args.startup_timeout, allow_inf=True)
        rate = positive_number("--request-rate", args.request_rate, allow_inf=True) or math.inf
        if args.max_candidates is not None and args.max_candidates < 1:
            raise ValueError(f"--max-candidates must be >= 1, got {args.max_candidates}")
        from pdtop.engine.build import parse_device

        sc = launch_scenario(parse_device(args.device).kind)
        if args.workload:
            sc = parse_workload(args.workload, sc)
        tok = Tokenizer.from_gguf(args.tokenizer or default_model_path())
        dataset = _dataset(args, tok)
        found = space_for_device(args.device, args.model, sc if dataset is None else dataset_space_scenario(
            sc, dataset), args.sglang_version)
        space, kind = found.space, found.kind
        log_dir = args.log_dir or (args.results + ".logs" if args.results else tempfile.mkdtemp(prefix="pdtop-tune-"))
        check_command(substitute(args.launch, {"{config}": os.path.abspath(os.path.join(log_dir, "candidate-001.yaml")),
                                               "{port}": "1", "{control_port}": "1"}).argv, args.sglang_version)
        os.makedirs(log_dir, exist_ok=True)
        default = device_default(kind)
        plan = LaunchPlan(args.launch, sc, rate, slo, default, startup or 600.0, budget_s=budget_s or math.inf,
                          max_candidates=args.max_candidates, log_dir=log_dir, results=args.results, seed=args.seed,
                          dataset=dataset, tokenizer=os.path.basename(args.tokenizer) if args.tokenizer else None,
                          control="{control_port}" in args.launch, sglang=args.sglang_version)
        prompts = ([], []) if dataset else text_prompts(sc, args.seed, tok.encode(corpus_text()), tok.decode)
        runner = LaunchRunner(plan, space, prompts, kind, _launch_progress(plan.budget_s))
        guess = (first_guess(space, found.spec, found.model, sc, slo)
                 if found.spec is not None and dataset is None else None)
    except (EngineError, OSError, ValueError) as exc:
        return fail("tune", exc)
    for line in [f"candidates' YAML and logs in {log_dir}", rules_line(args.sglang_version), *space.notes]:
        print(f"pdtop tune: {line}", file=sys.stderr, flush=True)
    try:
        with signals_as_exit():
            lr = tune_launch(runner, guess)
    except KeyboardInterrupt:
        where = f"; {args.results} keeps what was measured" if args.results else ""
        print(f"pdtop tune: interrupted after {len(runner.outcomes)} candidates, no server left running{where}",
              file=sys.stderr)
        return 130
    except INPUT_ERRORS as exc:
        return fail("tune", exc)
    return _launch_report(args, lr, kind, log_dir, plan.dataset)


def _dataset(args: argparse.Namespace, tok: Tokenizer) -> DatasetTraffic | None:
    """--dataset-path's requests (`bench --url`'s reader and options), None without one."""
    from pdtop.tune.http_workload import DatasetTraffic

    if not args.dataset_path:
        return None
    prompts = dataset_prompts(args, tok, args.num_prompts or 1000, args.seed)
    return DatasetTraffic(args.dataset_name, args.dataset_path, prompts, dataset_options(args))


def _launch_progress(budget_s: float) -> Callable[[Outcome, Measurement, float], None]:
    """One line per candidate on stderr: its figures, or why it failed; each new reason for TPOT standing in
    for the rounds' ITL once."""
    from pdtop.tune.report import describe_config
    from pdtop.tune.score import ITL_LABELS

    said: set[str] = set()

    def show(o: Outcome, m: Measurement, elapsed: float) -> None:
        budget = "" if budget_s == math.inf else f"/{budget_s:.0f}"
        how = "live" if o.live else f"launch {o.launch}"
        head = f"pdtop tune: [{elapsed:.0f}{budget} s, {how}] {describe_config(o.config)}: "
        if o.run is None:
            tail = o.log_tail.splitlines()[-1:] or [""]
            print(f"{head}failed: {o.reason} (log {o.log}){': ' + tail[0][:120] if tail[0] else ''}",
                  file=sys.stderr, flush=True)
        else:
            if o.run.no_rounds and o.run.no_rounds not in said:
                said.add(o.run.no_rounds)
                print(f"pdtop tune: TPOT p99 stands in for ITL p99: {o.run.no_rounds}", file=sys.stderr, flush=True)
            p50 = f" (p50 {o.run.rounds.itl_p50_s * 1e3:.2f})" if o.run.rounds else ""
            print(f"{head}{ITL_LABELS[m.itl_from]} {m.itl_p99_s * 1e3:.2f} ms{p50}  "
                  f"TTFT p99 {m.ttft_p99_s * 1e3:.0f} ms  "
                  f"prefill {m.prefill_tok_s:,.0f} tok/s  goodput {m.goodput_rps:.2f}/s ({m.good}/{m.requests} "
                  f"good) in {o.elapsed_s:.1f} s", file=sys.stderr, flush=True)

    return show


def _launch_report(args: argparse.Namespace, lr: LaunchReport, kind: str, log_dir: str,
                   dataset: DatasetTraffic | None) -> int:
    from pdtop.tune.report import best_yaml, front_and_choice, report_json
    from pdtop.tune.score import ITL_LABELS
    from pdtop.tune.sglang_server import rules_line

    report, load, itl = lr.report, os.getloadavg(), ITL_LABELS[lr.itl_from]
    if args.out and report.best is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(best_yaml(report, f"{args.device} (servers launched by --launch)", kind, itl, lr.itl_note))
    failures = [{"config": o.config.to_dict(), "reason": o.reason, "log": o.log, "log_tail": o.log_tail}
                for o in lr.failures]
    if args.json:
        out = report_json(report, args.device, load) | {
            "launch": {"command": args.launch, "log_dir": log_dir, "results": args.results, "reused": lr.reused,
                       "live": lr.live, "sglang_rules": rules_line(args.sglang_version),
                       "noise_goodput_rps": lr.noise_rps,
                       "itl_from": lr.itl_from, "itl_p99_ms_is": lr.itl_note,
                       "kept_default_within_noise": lr.kept_default,
                       "dataset": None if dataset is None else dataset.identity(),
                       "failures": failures},
            "out": args.out if args.out and report.best is not None else None}
        print(json_text(out))
        return 0 if report.best is not None else 1
    sc, slo, run = report.scenario, report.slo, report.run
    ttft = f", TTFT <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    traffic = dataset.describe() if dataset is not None else (
        f"{sc.decode_bs} streaming requests decoding ({sc.decode_prompt}-token prompts) while "
        f"{sc.long_prompts} prompts of {sc.long_tokens} tokens arrive")
    lines = [f"pdtop tune --launch for {args.device}: {traffic}",
             f"SLO per request (vllm bench serve --goodput): TPOT <= {slo.itl_s * 1e3:g} ms{ttft}; per "
             f"configuration: {itl} <= {slo.itl_s * 1e3:g} ms",
             f"{run.measured} measurements of {len(report.trials)} configurations on {run.launches} servers "
             f"({lr.live} set live on a running one, {lr.reused} reused from --results, {len(lr.failures)} failed) "
             f"in {run.elapsed_s:.0f} s{'' if run.complete else ', stopped by --budget-s or --max-candidates'}; "
             f"noise (goodput between repeats) {lr.noise_rps:.2f}/s; load average {load[0]:.2f}",
             rules_line(args.sglang_version), lr.itl_note, "",
             *front_and_choice(report, args.out, itl, [f"failed: {o.reason} (log {o.log})" for o in lr.failures],
                               lr.kept_default)]
    print("\n".join(lines))
    return 0 if report.best is not None else 1

# ---- --workload ---------------------------------------------------------------------------

def parse_workload(text: str, base: Scenario) -> Scenario:
    """`decode_bs=64,long_tokens=16384` (or a YAML file of those keys) over `base`; FieldError if malformed."""
    if "=" not in text and not os.path.isfile(text) and (os.sep in text or text.endswith((".yaml", ".yml", ".json"))):
        what = "is a directory, not a workload file" if os.path.isdir(text) else "no such workload file"
        raise FieldError(text, f"{what} (a YAML mapping of {', '.join(WORKLOAD_KEYS)}, or KEY=VALUE,...)", "workload ")
    if "=" not in text and os.path.isfile(text):
        try:
            raw = read_yaml(text) or {}
        except OSError as exc:
            raise FieldError(text, f"cannot read it ({exc.strerror or exc})", "workload ") from None
        except YamlError as exc:
            raise FieldError(text, str(exc), "workload ") from None
        if not isinstance(raw, dict):
            raise FieldError(text, "must be a mapping of " + ", ".join(WORKLOAD_KEYS), "workload ")
        items = [(show_key(k), v) for k, v in raw.items()]
    else:
        items = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise FieldError(part, f"expected KEY=VALUE with KEY one of {', '.join(WORKLOAD_KEYS)}", "workload ")
            items.append((key.strip(), value.strip()))
    values: dict[str, int] = {}
    for key, value in items:
        if key not in WORKLOAD_KEYS:
            raise FieldError(show_key(key), f"unknown; known: {', '.join(WORKLOAD_KEYS)}", "workload ")
        try:
            number = int(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        low = 0 if key == "settle_rounds" else 1
        if number is None or number < low:
            raise FieldError(key, f"must be an integer >= {low}, got {show(value)}", "workload ")
        values[key] = number
    return dataclasses.replace(base, **values)
