"""Find the PD multiplexing configuration (SGLang's sm_group_num, manual_divisions,
split_forward_token_budget, max_split_forward_layers, decode_bs_divisor, overlap_decode_full_sm)
that meets the SLOs with the best goodput, for a device, model and workload, and write it as
SGLang's --pdmux-config-path YAML.

Each candidate runs `pdtop bench`'s seeded scenario (requests decoding while long prompts arrive
one after another; --workload changes it) and is measured for ITL p99, TTFT p99, prefill
throughput (prompt tokens/s while prompts wait) and goodput (requests/s that meet every SLO).
The search is a coarse grid refined around the Pareto front (docs/tune.md). Printed: the front
(ITL p99 against prefill throughput) as a table and a plot, and the chosen configuration against
SGLang's default on the same workload. Exit status 1 when no configuration meets the SLOs (the
closest are shown), 2 for bad input.

On sim: devices the search runs to the end in seconds; on cpu and cuda it runs real rounds,
shows each candidate as it goes and stops at --budget-s.

Examples:
  pdtop tune --slo-itl-ms 10.25 --out best.yaml      (then: pdtop --config best.yaml)
  pdtop tune --device sim:H200 --slo-itl-ms 8 --slo-ttft-ms 600 --json
  pdtop tune --device sim:H100 --slo-itl-ms 12 --workload decode_bs=64,long_tokens=16384
  pdtop tune --device cpu --slo-itl-ms 80 --budget-s 300
  pdtop tune --slo-itl-ms 20 --slo-ttft-ms 1000 --policies pdmux,chunked,disagg --link rdma100
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from pdtop.commands import _tune_launch
from pdtop.commands._common import INPUT_ERRORS, cuda_missing, fail, positive_number
from pdtop.engine.errors import DeviceError
from pdtop.telemetry.encode import encode

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdtop.analysis.tune import Trial
    from pdtop.analysis.tune_workload import TuneReport
    from pdtop.engine.engine import Engine

SIM_BUDGET_S, REAL_BUDGET_S = 60.0, 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--device", default="sim:H100", help="sim:GPU, cpu or cuda (default: sim:H100)")
    p.add_argument("--model", default=None, help="GGUF path or synthetic:NAME (default: the device's default)")
    p.add_argument("--slo-itl-ms", required=True, metavar="MS",
                   help="ITL p99 target, milliseconds (--launch: each request's TPOT)")
    p.add_argument("--slo-ttft-ms", metavar="MS", help="TTFT p99 target of the long prompts, milliseconds")
    p.add_argument("--workload", metavar="K=V,...",
                   help="change the scenario: decode_bs, decode_prompt, long_tokens, long_prompts, settle_rounds, "
                   "decode_tokens (or a YAML file of them)")
    p.add_argument("--budget-s", metavar="S",
                   help=f"stop searching after this many seconds (default {SIM_BUDGET_S:g} on sim:, "
                   f"{REAL_BUDGET_S:g} on cpu/cuda, none with --launch); counted from the command's start")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N", help="KV cache size in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE", help="write the chosen configuration as SGLang's pdmux YAML")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--policies", metavar="P,...",
                   help="compare the ways instead (pdmux, chunked, prefill-first, disagg): the best configuration "
                        "of each under the SLOs, and goodput per device")
    p.add_argument("--link", metavar="LINK", help="disagg's KV link with --policies (default: rdma400 on sim:, "
                                                   "unpaced copies on cpu)")
    _tune_launch.add_arguments(p)
    p.epilog = _tune_launch.LAUNCH_HELP


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # importing torch and loading the model count against the budget
    from pdtop.analysis.policy_bench import SCENARIOS
    from pdtop.analysis.tune import Slo
    from pdtop.analysis.tune_workload import parse_workload, tune
    from pdtop.engine.build import parse_device

    try:
        itl_ms = positive_number("--slo-itl-ms", args.slo_itl_ms)
        ttft_ms = positive_number("--slo-ttft-ms", args.slo_ttft_ms)
        budget = positive_number("--budget-s", args.budget_s)
        if args.kv_tokens is not None and args.kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be >= 1, got {args.kv_tokens}")
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
        from pdtop.commands._tune_policies import run_policies

        return run_policies(args, slo, budget, (SIM_BUDGET_S, REAL_BUDGET_S))
    if args.launch is not None:
        return _tune_launch.run(args, slo, budget)
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
        report = tune(make_engine, sc, slo, budget_s - (time.monotonic() - started), _progress(budget_s, real, started))
    except INPUT_ERRORS as exc:
        return fail("tune", exc)
    load = os.getloadavg()
    if args.out and report.best is not None:
        _write(args.out, report, args.device)
    if args.json:
        from pdtop.analysis.tune_report import report_json

        out = report_json(report, args.device, load)
        out["out"] = args.out if args.out and report.best is not None else None
        print(encode(out))
    else:
        print("\n".join(_text(report, args, load)))
    return 0 if report.best is not None else 1


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


def _progress(budget_s: float, real: bool, started: float) -> Callable[[Trial, float], None]:
    """Real devices: one line per candidate on stderr. sim: one line rewritten, on a terminal only.
    The seconds shown count from `started`, the command's start, as the budget does."""
    from pdtop.analysis.tune_report import describe_config

    count = 0
    tty = sys.stderr.isatty()

    def show(trial: Trial, _elapsed: float) -> None:
        nonlocal count
        elapsed = time.monotonic() - started
        count += 1
        r = trial.result
        line = (f"pdtop tune: [{count}] {elapsed:.0f}/{budget_s:.0f} s  ITL p99 {r.itl_p99_s * 1e3:.2f} ms  "
                f"prefill {r.prefill_tok_s:,.0f} tok/s  goodput {r.goodput_rps:.2f}/s  {describe_config(trial.config)}")
        if real:
            print(line, file=sys.stderr, flush=True)
        elif tty:
            print(f"\r\033[K{line[:150]}", end="", file=sys.stderr, flush=True)

    return show


def _write(path: str, report: TuneReport, device: str) -> None:
    from pdtop.analysis.tune_report import best_yaml
    from pdtop.engine.build import parse_device

    with open(path, "w", encoding="utf-8") as f:
        f.write(best_yaml(report, device, parse_device(device).kind))


def _text(report: TuneReport, args: argparse.Namespace, load: tuple[float, float, float]) -> list[str]:
    from pdtop.analysis.tune_report import comparison, front_plot, trial_table

    sc, slo, run = report.scenario, report.slo, report.run
    if sys.stderr.isatty() and not args.device.startswith(("cpu", "cuda")):
        print(file=sys.stderr)  # end the progress line
    ttft = f", TTFT p99 <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    lines = [
        f"pdtop tune on {args.device}: {sc.decode_bs} requests decoding ({sc.decode_prompt}-token prompts) while "
        f"{sc.long_prompts} prompts of {sc.long_tokens} tokens arrive; seed {args.seed}",
        f"SLO: ITL p99 <= {slo.itl_s * 1e3:g} ms{ttft}; decode-only ITL "
        f"{report.default.result.decode_only_itl_s * 1e3:.2f} ms",
        f"searched {run.measured} configurations ({run.points} of {report.grid_size} grid points) in "
        f"{run.elapsed_s:.1f} s{'' if run.complete else ', stopped by --budget-s'}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        "Pareto front (ITL p99 against prefill throughput); * chosen, D SGLang's default",
    ]
    marks = {id(report.default): "D"} | ({id(report.best): "*"} if report.best is not None else {})
    lines += trial_table(report.front, slo, marks)
    lines += ["", *front_plot(report), ""]
    if report.best is None:
        lines.append("no configuration meets the SLOs; the closest:")
        lines += trial_table(report.closest, slo)
        return lines
    lines.append("chosen: best goodput among the configurations that meet the SLOs")
    lines += comparison(report)
    if args.out:
        lines.append(f"wrote {args.out} (SGLang: --pdmux-config-path {args.out}; pdtop --config {args.out})")
    return lines
