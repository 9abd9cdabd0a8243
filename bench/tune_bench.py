"""`pdtop tune` on the seed's scenario: how much goodput and prefill throughput the tuned
configuration gets against SGLang's default, under an ITL SLO the default misses, and how long
the search takes.

    .venv/bin/python bench/tune_bench.py [--device sim:H100] [--json]

The ITL SLO is halfway between the decode-only ITL and the ITL p99 of SGLang's default
configuration on the same scenario (both measured first, by the same run as every candidate),
so the default misses it. Prints the two configurations, their figures, the tuned/default
ratios, the search's size and time, and the load average (the machine may be shared: times are
noisy, the figures on a sim: device are not). Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pdtop.analysis.policy_bench import SCENARIOS
from pdtop.analysis.tune import Slo
from pdtop.analysis.tune_report import comparison, describe_config, ratio
from pdtop.analysis.tune_workload import SGLANG_DEFAULT, measure, tune
from pdtop.engine.build import build_engine
from pdtop.engine.engine import Engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:H100")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), file=sys.stderr if args.json else sys.stdout, flush=True)  # the machine of these figures
    sc = SCENARIOS["sim"]

    def make() -> Engine:
        return build_engine(args.device, None)

    engine = make()
    try:
        default = measure(engine, sc, Slo(1.0), SGLANG_DEFAULT)
    finally:
        engine.close()
    slo = Slo((default.decode_only_itl_s + default.itl_p99_s) / 2)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    report = tune(make, sc, slo)
    search_s = time.perf_counter() - t0
    load = os.getloadavg()
    d, b = report.default.result, report.best.result if report.best else None
    figures = {
        "device": args.device, "decode_only_itl_ms": default.decode_only_itl_s * 1e3,
        "default_itl_p99_ms": default.itl_p99_s * 1e3, "slo_itl_ms": slo.itl_s * 1e3,
        "default": describe_config(report.default.config),
        "tuned": describe_config(report.best.config) if report.best else None,
        "goodput_rps": {"default": d.goodput_rps, "tuned": b.goodput_rps if b else None},
        "prefill_tok_s": {"default": d.prefill_tok_s, "tuned": b.prefill_tok_s if b else None},
        "goodput_ratio": b.goodput_rps / d.goodput_rps if b and d.goodput_rps else None,
        "prefill_ratio": b.prefill_tok_s / d.prefill_tok_s if b else None,
        "search_s": search_s, "measured": report.run.measured, "grid_points": report.grid_size,
        "loadavg_before": load0, "loadavg_after": load,
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"pdtop tune bench on {args.device}: the seed's scenario ({sc.decode_bs} decoding at {sc.decode_prompt}, "
          f"{sc.long_prompts} x {sc.long_tokens}-token prompts)")
    print(f"decode-only ITL {figures['decode_only_itl_ms']:.2f} ms, SGLang default ITL p99 "
          f"{figures['default_itl_p99_ms']:.2f} ms -> ITL SLO {figures['slo_itl_ms']:.2f} ms")
    print(f"default: {figures['default']}")
    print(f"tuned:   {figures['tuned'] or 'none meets the SLO'}")
    if b is not None:
        print("\n".join(comparison(report)))
        print(f"goodput {ratio(b.goodput_rps, d.goodput_rps)}, prefill throughput "
              f"{ratio(b.prefill_tok_s, d.prefill_tok_s)} (tuned/default)")
    print(f"search: {report.run.measured} configurations measured of {report.grid_size} grid points in "
          f"{search_s:.1f} s; load average {load0[0]:.2f} before, {load[0]:.2f} after ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
