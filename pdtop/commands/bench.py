"""Compare scheduling policies on a fixed, seeded workload: long prompts arrive while a decode
batch is running. Reports, per policy, TTFT p50/p99 of the long prompts, decode ITL p50/p99/max
while they prefill, the decode-only ITL baseline (every unit to decode, no prefill) and output
tokens/s. `--device sim:H100` runs the seed's scenario (32 requests decoding at context 2048,
8192-token prompts) on the simulated GPU; `--device cpu` runs the real model on this machine's
cores (8 requests decoding, 1024-token prompts).

With --url http://HOST:PORT/v1 it is a load generator instead: vllm bench serve's seeded random
load, sent as streaming requests to any OpenAI-compatible server (pdtop serve --api-port, vLLM,
SGLang), reporting request and token throughput, TTFT, TPOT, ITL, E2EL and goodput.
"""
from __future__ import annotations

import argparse
import json

from pdtop.commands import _bench_url
from pdtop.commands._common import INPUT_ERRORS, add_runtime_arguments, fail, runtime_options
from pdtop.engine.scheduling.policies import POLICIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=(*POLICIES, "all"), default="all", help="policy to run (default: all of them)")
    p.add_argument("--device", default="sim:H100", help="cpu, cuda, or sim:GPU (default: sim:H100)")
    p.add_argument("--model", default=None, help="GGUF path or synthetic:NAME (default: the device's default)")
    p.add_argument("--config", default=None, help="SGLang-compatible pdmux YAML")
    p.add_argument("--decode-bs", type=int, default=None, help="requests decoding when the long prompts arrive")
    p.add_argument("--long-tokens", type=int, default=None, help="tokens in each long prompt")
    p.add_argument("--long-prompts", type=int, default=None, help="how many long prompts arrive (one after another)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    add_runtime_arguments(p)
    _bench_url.add_arguments(p)


def _table(results: dict[str, dict], device: str) -> str:
    head = (f"{'policy':<14}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'ITL max':>9}"
            f"{'baseline':>10}{'p99/base':>10}{'out tok/s':>11}")
    lines = [f"pdtop bench on {device} (ms unless noted)", head]
    for policy, r in results.items():
        t, i, b = r["ttft_ms"], r["itl_ms"], r["itl_baseline_ms"]
        lines.append(f"{policy:<14}{t['p50']:>10.1f}{t['p99']:>10.1f}{i['p50']:>9.1f}{i['p99']:>9.1f}{i['max']:>9.1f}"
                     f"{b:>10.1f}{i['p99'] / b:>10.2f}{r['output_tok_s']:>11.1f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.url:
        return _bench_url.run(args)
    from dataclasses import replace

    from pdtop.analysis.policy_bench import SCENARIOS, run_bench
    from pdtop.engine.build import build_engine, parse_device
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config

    try:
        sc = SCENARIOS[parse_device(args.device).kind]
        for name in ("decode_bs", "long_tokens", "long_prompts"):
            value = getattr(args, name)
            if value is not None:
                if value < 1:
                    return fail("bench", f"--{name.replace('_', '-')} must be >= 1")
                sc = replace(sc, **{name: value})
        policies = list(POLICIES) if args.policy == "all" else [args.policy]
        config = load_pdmux_config(args.config) if args.config else PdmuxConfig()
        results = run_bench(lambda policy: build_engine(args.device, args.model, config, policy, seed=args.seed,
                                                        **runtime_options(args)), policies, sc)
    except INPUT_ERRORS as exc:
        return fail("bench", exc)
    if args.json:
        print(json.dumps({p: {k: v for k, v in r.items() if k != "decode_units"} for p, r in results.items()}))
    else:
        print(_table(results, args.device))
    return 0
