"""`pdtop tune` and the online level rule: how much goodput and prefill throughput the tuned
configuration, and SGLang's default knobs with `level_rule: slo` (no search), get against SGLang's
default, under an ITL SLO the default misses, and how long the search takes.

    .venv/bin/python bench/tune_bench.py [--device sim:H100] [--scenario seed|12x16k|all] [--json]

The ITL SLO is halfway between the decode-only ITL and the ITL p99 of SGLang's default
configuration on the same scenario (both measured first, by the same run as every candidate),
so the default misses it. Prints the three configurations, their figures, the online rule's
TTFT p99 against the tuned one's, the search's size and time, and the load average (the machine may be shared: times are
noisy, the figures on a sim: device are not). Asserts nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pdtop.bench.policy_bench import SCENARIOS, Scenario
from pdtop.engine.build import build_engine
from pdtop.engine.engine import Engine
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.tune.engine_search import measure, tune
from pdtop.tune.report import describe_config
from pdtop.tune.score import Measurement, Slo
from pdtop.tune.space import SGLANG_DEFAULT

SCENARIO_NAMES = ("seed", "12x16k")


def scenario(name: str) -> Scenario:
    """The seed's scenario (32 decoding at 2,048 tokens, 8,192-token prompts), or 12 decoding with
    16,384-token prompts (a long prompt against a small batch: decode needs few units)."""
    sc = SCENARIOS["sim"]
    return sc if name == "seed" else dataclasses.replace(sc, decode_bs=12, long_tokens=16384, decode_tokens=16384)


def one(device: str, name: str) -> dict[str, Any]:
    sc = scenario(name)

    def make() -> Engine:
        return build_engine(device, None)

    def run(config: PdmuxConfig, slo: Slo) -> Measurement:
        engine = make()
        try:
            return measure(engine, sc, slo, config)
        finally:
            engine.close()

    default = run(SGLANG_DEFAULT, Slo(1.0))
    slo = Slo((default.decode_only_itl_s + default.itl_p99_s) / 2)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    report = tune(make, sc, slo)
    search_s = time.perf_counter() - t0
    online_config = SGLANG_DEFAULT.replace(level_rule="slo", slo_itl_ms=slo.itl_s * 1e3)
    online = run(online_config, slo)
    budget = report.best.config.split_forward_token_budget if report.best else None
    online_budget = run(online_config.replace(split_forward_token_budget=budget), slo) if budget else None
    d, b = report.default.result, report.best.result if report.best else None

    def row(m: Measurement | None) -> dict[str, Any] | None:
        if m is None:
            return None
        return {"itl_p99_ms": m.itl_p99_s * 1e3, "ttft_p99_ms": m.ttft_p99_s * 1e3, "prefill_tok_s": m.prefill_tok_s,
                "goodput_rps": m.goodput_rps, "meets_slo": slo.met(m)}

    return {
        "device": device, "scenario": name, "workload": dataclasses.asdict(sc),
        "decode_only_itl_ms": default.decode_only_itl_s * 1e3, "slo_itl_ms": slo.itl_s * 1e3,
        "configs": {"default": describe_config(report.default.config),
                    "tuned": describe_config(report.best.config) if report.best else None,
                    "online": f"{describe_config(SGLANG_DEFAULT)} level_rule=slo",
                    "online+budget": f"the same, budget={budget} (the tuned one's)"},
        "default": row(d), "tuned": row(b), "online": row(online), "online+budget": row(online_budget),
        "online_ttft_over_tuned": online.ttft_p99_s / b.ttft_p99_s if b else None,
        "search_s": search_s, "measured": report.run.measured, "grid_points": report.grid_size,
        "loadavg_before": load0, "loadavg_after": os.getloadavg(),
    }


def show(f: dict[str, Any]) -> None:
    w = f["workload"]
    print(f"pdtop tune bench on {f['device']}, scenario {f['scenario']}: {w['decode_bs']} decoding at "
          f"{w['decode_prompt']} tokens, {w['long_prompts']} x {w['long_tokens']}-token prompts")
    print(f"decode-only ITL {f['decode_only_itl_ms']:.2f} ms, SGLang default ITL p99 "
          f"{f['default']['itl_p99_ms']:.2f} ms -> ITL SLO {f['slo_itl_ms']:.2f} ms")
    print(f"{'':<14}{'ITL p99':>9}{'TTFT p99':>10}{'prefill tok/s':>15}{'goodput':>10}  SLO  configuration")
    for key in ("default", "tuned", "online", "online+budget"):
        r = f[key]
        if r is None:
            print(f"{key:<14}  none meets the SLO" if key == "tuned" else f"{key:<14}  -")
            continue
        print(f"{key:<14}{r['itl_p99_ms']:>6.2f} ms{r['ttft_p99_ms']:>7.0f} ms{r['prefill_tok_s']:>15,.0f}"
              f"{r['goodput_rps']:>8.2f}/s  {'yes' if r['meets_slo'] else 'no ':<4} {f['configs'][key]}")
    if f["online_ttft_over_tuned"] is not None:
        print(f"online TTFT p99 / tuned: x{f['online_ttft_over_tuned']:.2f}")
    print(f"search: {f['measured']} configurations of {f['grid_points']} grid points in {f['search_s']:.1f} s; "
          f"load average {f['loadavg_before'][0]:.2f} before, {f['loadavg_after'][0]:.2f} after "
          f"({os.cpu_count()} CPUs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:H100")
    parser.add_argument("--scenario", choices=(*SCENARIO_NAMES, "all"), default="all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), file=sys.stderr if args.json else sys.stdout, flush=True)  # the machine of these figures
    names = SCENARIO_NAMES if args.scenario == "all" else (args.scenario,)
    results = [one(args.device, name) for name in names]
    if args.json:
        print(json.dumps(results))
        return 0
    for i, f in enumerate(results):
        if i:
            print()
        show(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
