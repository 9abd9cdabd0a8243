"""`pdtop tune --policies ...`: the comparison of the ways (`analysis/tune_policies.py`), printed."""
from __future__ import annotations

import argparse
import os
import sys

from pdtop.analysis.tune import Slo
from pdtop.commands._common import INPUT_ERRORS, cuda_missing, fail
from pdtop.engine.errors import DeviceError
from pdtop.engine.scheduling.policies import DISAGG_ON_CUDA
from pdtop.telemetry.encode import encode

BAD_INPUT: tuple[type[BaseException], ...] = (*INPUT_ERRORS, ValueError)


def run_policies(args: argparse.Namespace, slo: Slo, budget: float | None, defaults: tuple[float, float]) -> int:
    """`defaults`: tune's budgets (sim:, real devices) when --budget-s is not given."""
    from pdtop.analysis.policy_bench import SCENARIOS
    from pdtop.analysis.tune_policies import compare, parse_policies, table, to_json
    from pdtop.analysis.tune_workload import parse_workload
    from pdtop.engine.build import build_engine, load_for, parse_device
    from pdtop.engine.engine import Engine
    from pdtop.engine.roofline.kv import parse_link
    from pdtop.engine.runtime.kv_link import DEFAULT_SIM_LINK, UNPACED

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
        real = where.kind != "sim"
        rows = compare(make, sc, slo, policies, name, budget or defaults[real],
                       lambda msg: print(f"pdtop tune: {msg}", file=sys.stderr, flush=True))
    except BAD_INPUT as exc:
        return fail("tune", exc)
    load = os.getloadavg()
    if args.json:
        print(encode({"device": args.device, "slo": {"itl_ms": slo.itl_s * 1e3,
                                                      "ttft_ms": slo.ttft_s * 1e3 if slo.ttft_s else None},
                      "scenario": vars(sc), "loadavg": list(load), "policies": to_json(rows)}))
    else:
        print(f"pdtop tune --policies on {args.device}: {sc.decode_bs} requests decoding ({sc.decode_prompt}-token "
              f"prompts) while {sc.long_prompts} prompts of {sc.long_tokens} tokens arrive; load average "
              f"{load[0]:.2f}")
        print("\n".join(table(rows, slo)))
    return 0 if any(r.meets for r in rows) else 1
