"""`pdtop tune --launch CMD`: the options, and the run (`pdtop.analysis.tune_launch` does the work)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from typing import TYPE_CHECKING

from pdtop.commands._common import INPUT_ERRORS, fail, positive_number
from pdtop.commands._datasets import add_dataset_arguments, dataset_problem, dataset_prompts
from pdtop.telemetry.encode import encode

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdtop.analysis.tune import Measurement, Slo
    from pdtop.analysis.tune_dataset import DatasetTraffic
    from pdtop.analysis.tune_launch import LaunchReport, Outcome
    from pdtop.engine.model.tokenizer import Tokenizer

TPOT = "TPOT p99"  # what the tables' ITL column holds under --launch
LAUNCH_HELP = """\
--launch runs each candidate on a server started for it, as vLLM's benchmarks/auto_tune does:
{config} in CMD becomes the candidate's YAML file and {port} a free loopback port; the command
runs in its own process group, is ready when /health and then /v1/models answer 200 (within
--startup-timeout), gets one uncounted warm-up request, then the workload over its OpenAI API
(decode_bs streaming requests decoding while long prompts arrive one after another, or at
--request-rate; or, with --dataset-path, the dataset's requests as `pdtop bench --url` reads and
sends them: --dataset-name sharegpt|custom, --num-prompts of them in seeded order, at --request-rate
per second, Poisson, default all at once, each with ignore_eos), and is stopped (SIGTERM to the
group, SIGKILL after 10 s, until the port is free). No server outlives pdtop: not on success,
error, Ctrl+C or SIGTERM. A request is good, as `vllm bench serve --goodput ttft:MS tpot:MS`
counts it, when its TTFT meets --slo-ttft-ms and its TPOT (not its p99 gap) meets --slo-itl-ms.
--device and --model name what the server runs, for the search space; nothing is loaded here.
--results remembers the workload (the scenario's keys, or the dataset file's SHA-256 and
options): a resume with another one is refused.
  pdtop tune --launch 'pdtop serve --device cpu --workload none --port 0 --config {config} --api-port {port}' \\
             --device cpu --slo-itl-ms 300 --budget-s 900 --results runs.jsonl --out best.yaml
  pdtop tune --launch 'python -m sglang.launch_server --model-path M --enable-pdmux \\
             --pdmux-config-path {config} --port {port}' --slo-itl-ms 30 --slo-ttft-ms 2000 --budget-s 3600 \\
             --dataset-name sharegpt --dataset-path ShareGPT_V3.json --num-prompts 200 --request-rate 4
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace, slo: Slo, budget_s: float | None) -> int:
    from pdtop.analysis.launch import check_template, signals_as_exit
    from pdtop.analysis.tune_http import launch_scenario, text_prompts
    from pdtop.analysis.tune_launch import (
        LaunchPlan,
        LaunchTuner,
        dataset_space_scenario,
        launch_space_for,
        tune_launch,
    )
    from pdtop.analysis.tune_workload import device_default, parse_workload
    from pdtop.engine.build import parse_device
    from pdtop.engine.errors import EngineError
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.engine.scheduling.workload import corpus_text

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
        kind = parse_device(args.device).kind
        sc = launch_scenario(kind)
        if args.workload:
            sc = parse_workload(args.workload, sc)
        tok = Tokenizer.from_gguf(args.tokenizer or default_model_path())
        dataset = _dataset(args, tok)
        space, kind = launch_space_for(args.device, args.model, sc if dataset is None else dataset_space_scenario(
            sc, dataset))
        log_dir = args.log_dir or (args.results + ".logs" if args.results else tempfile.mkdtemp(prefix="pdtop-tune-"))
        os.makedirs(log_dir, exist_ok=True)
        default = device_default(kind)
        plan = LaunchPlan(args.launch, sc, rate, slo, default, startup or 600.0, budget_s=budget_s or math.inf,
                          max_candidates=args.max_candidates, log_dir=log_dir, results=args.results, seed=args.seed,
                          dataset=dataset, tokenizer=os.path.basename(args.tokenizer) if args.tokenizer else None)
        prompts = ([], []) if dataset else text_prompts(sc, args.seed, tok.encode(corpus_text()), tok.decode)
        tuner = LaunchTuner(plan, space, prompts, kind)
    except (EngineError, OSError, ValueError) as exc:
        return fail("tune", exc)
    print(f"pdtop tune: candidates' YAML and logs in {log_dir}", file=sys.stderr, flush=True)
    try:
        with signals_as_exit():
            lr = tune_launch(tuner, _progress(plan.budget_s))
    except KeyboardInterrupt:
        where = f"; {args.results} keeps what was measured" if args.results else ""
        print(f"pdtop tune: interrupted after {len(tuner.outcomes)} candidates, no server left running{where}",
              file=sys.stderr)
        return 130
    except INPUT_ERRORS as exc:
        return fail("tune", exc)
    return _report(args, lr, kind, log_dir, plan.dataset)


def _dataset(args: argparse.Namespace, tok: Tokenizer) -> DatasetTraffic | None:
    """--dataset-path's requests (`bench --url`'s reader and options), None without one."""
    from pdtop.analysis.tune_dataset import DatasetTraffic

    if not args.dataset_path:
        return None
    num = args.num_prompts or 1000
    prompts = dataset_prompts(args, tok, num, args.seed)
    options = ({"sharegpt_output_len": args.sharegpt_output_len} if args.dataset_name == "sharegpt" else
               {"custom_output_len": args.custom_output_len, "skip_chat_template": args.skip_chat_template})
    return DatasetTraffic(args.dataset_name, args.dataset_path, prompts, options)


def _progress(budget_s: float) -> Callable[[Outcome, Measurement, float], None]:
    from pdtop.analysis.tune_report import describe_config

    def show(o: Outcome, m: Measurement, elapsed: float) -> None:
        budget = "" if budget_s == math.inf else f"/{budget_s:.0f}"
        head = f"pdtop tune: [{elapsed:.0f}{budget} s] {describe_config(o.config)}: "
        if o.run is None:
            tail = o.log_tail.splitlines()[-1:] or [""]
            print(f"{head}failed: {o.reason} (log {o.log}){': ' + tail[0][:120] if tail[0] else ''}",
                  file=sys.stderr, flush=True)
        else:
            print(f"{head}{TPOT} {m.itl_p99_s * 1e3:.2f} ms  TTFT p99 {m.ttft_p99_s * 1e3:.0f} ms  "
                  f"prefill {m.prefill_tok_s:,.0f} tok/s  goodput {m.goodput_rps:.2f}/s ({m.good}/{m.requests} "
                  f"good) in {o.elapsed_s:.1f} s", file=sys.stderr, flush=True)

    return show


def _report(args: argparse.Namespace, lr: LaunchReport, kind: str, log_dir: str,
            dataset: DatasetTraffic | None) -> int:
    from pdtop.analysis.tune_report import best_yaml, comparison, front_plot, report_json, trial_table

    report, load = lr.report, os.getloadavg()
    if args.out and report.best is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(best_yaml(report, f"{args.device} (servers launched by --launch)", kind, TPOT))
    failures = [{"config": o.config.to_dict(), "reason": o.reason, "log": o.log, "log_tail": o.log_tail}
                for o in lr.failures]
    if args.json:
        out = report_json(report, args.device, load) | {
            "launch": {"command": args.launch, "log_dir": log_dir, "results": args.results, "reused": lr.reused,
                       "noise_goodput_rps": lr.noise_rps,
                       "itl_p99_ms_is": "the p99 over requests of each request's TPOT",
                       "kept_default_within_noise": lr.kept_default,
                       "dataset": None if dataset is None else dataset.identity(),
                       "failures": failures},
            "out": args.out if args.out and report.best is not None else None}
        print(encode(out))
        return 0 if report.best is not None else 1
    sc, slo, run = report.scenario, report.slo, report.run
    ttft = f", TTFT <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    traffic = dataset.describe() if dataset is not None else (
        f"{sc.decode_bs} streaming requests decoding ({sc.decode_prompt}-token prompts) while "
        f"{sc.long_prompts} prompts of {sc.long_tokens} tokens arrive")
    lines = [f"pdtop tune --launch for {args.device}: {traffic}",
             f"SLO per request (vllm bench serve --goodput): TPOT <= {slo.itl_s * 1e3:g} ms{ttft}",
             f"{run.measured} candidates ({lr.reused} reused from --results, {len(lr.failures)} failed) in "
             f"{run.elapsed_s:.0f} s{'' if run.complete else ', stopped by --budget-s or --max-candidates'}; "
             f"noise (goodput between repeats) {lr.noise_rps:.2f}/s; load average {load[0]:.2f}",
             "", f"Pareto front ({TPOT} against prefill throughput); * chosen, D SGLang's default"]
    marks = {id(report.default): "D"} | ({id(report.best): "*"} if report.best is not None else {})
    lines += [*trial_table(report.front, slo, marks, TPOT), "", *front_plot(report, itl=TPOT), ""]
    for o in lr.failures:
        lines.append(f"failed: {o.reason} (log {o.log})")
    if report.best is None:
        lines += ["no configuration meets the SLOs; the closest:", *trial_table(report.closest, slo, itl=TPOT)]
    else:
        if lr.kept_default:
            lines.append("chosen: SGLang's default (no other configuration beat it by more than the noise)")
        else:
            lines.append("chosen: best goodput among the configurations that meet the SLOs")
        lines += comparison(report, TPOT)
        if args.out:
            lines.append(f"wrote {args.out} (SGLang: --pdmux-config-path {args.out}; pdtop --config {args.out})")
    print("\n".join(lines))
    return 0 if report.best is not None else 1
