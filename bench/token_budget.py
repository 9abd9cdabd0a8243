"""What smaller prefill slices cost decode: ITL while a long prompt prefills, per split_forward_token_budget.

One engine on the CPU device (the real model): `--decode-bs` requests decode while a
`--prompt`-token prompt arrives, `--rounds` times per budget, the budgets taking turns so
that every one sees the same machine load. Per budget: the decode steps taken while the
prompt prefilled (p50, p99), the prefill slices, and the prompt's TTFT (p50). Quote the
load average with the figures.

Usage: .venv/bin/python bench/token_budget.py [--budgets 65536,4096,2048] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os

from pdtop.analysis.metrics import percentile
from pdtop.engine.build import build_engine
from pdtop.engine.scheduling.commands import Set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default="65536,4096,2048")
    ap.add_argument("--decode-bs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024, help="tokens of the long prompt")
    ap.add_argument("--rounds", type=int, default=3, help="long prompts per budget")
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    budgets = [int(b) for b in args.budgets.split(",")]

    engine = build_engine("cpu", kv_capacity_tokens=32768)
    steps: dict[int, list[float]] = {b: [] for b in budgets}
    ttfts: dict[int, list[float]] = {b: [] for b in budgets}
    slices: dict[int, int] = {}
    try:
        decoders = [engine.submit(engine.prompts.make(64), 3500, ignore_eos=True)  # decoding to the end
                    for _ in range(args.decode_bs)]
        while not all(r.output_ids for r in decoders):
            if any(r.finished for r in decoders):
                raise SystemExit(f"a decode request was refused: {next(r.error for r in decoders if r.finished)}")
            engine.step()
        for _ in range(args.rounds):
            for budget in budgets:
                engine.control(Set(split_forward_token_budget=budget))
                engine.step()
                req = engine.submit(engine.prompts.make(args.prompt), 1, ignore_eos=True)
                while not req.output_ids:
                    rec = engine.step()
                    if rec.prefills and rec.decode_bs:
                        steps[budget].append(rec.decode_step_s)
                        slices[budget] = -(-rec.prefills[0].layers_total // rec.prefills[0].layers_per_round)
                ttfts[budget].append(req.token_times[0] - req.arrival)
    finally:
        engine.close()
    print(f"decode bs {args.decode_bs}, {args.prompt}-token prompts, {args.rounds} per budget, "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'budget':>8}{'slices':>8}{'steps':>7}{'ITL p50 ms':>12}{'ITL p99 ms':>12}{'TTFT p50 s':>12}")
    for b in budgets:
        print(f"{b:>8}{slices.get(b, 0):>8}{len(steps[b]):>7}{percentile(steps[b], 50) * 1e3:>12.1f}"
              f"{percentile(steps[b], 99) * 1e3:>12.1f}{percentile(ttfts[b], 50):>12.2f}")


if __name__ == "__main__":
    main()
