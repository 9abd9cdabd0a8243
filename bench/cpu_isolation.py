"""Does the CPU split isolate decode from prefill? Decode step times, side by side, in one run.

Rows (same decode batch, same model, median and p99 of decode steps):
  decode on every core      the decode-only baseline (level "all to decode")
  decode on its cores       the split level, nothing on the prefill cores
  + prefill on the others   the split level while a long prefill runs on the prefill cores
  decode time-shared        every core, with the same prefill sharing them (no isolation)

Usage: .venv/bin/python bench/cpu_isolation.py [--decode-bs 8] [--prompt 1024] [--steps 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

from pdtop.analysis.metrics import percentile
from pdtop.engine.devices.cpu import CpuDevice, usable_cores
from pdtop.engine.model.loader import default_model_path, load_model
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner, PrefillState
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.tokens import append_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decode-bs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024, help="tokens of the long prefill")
    ap.add_argument("--steps", type=int, default=30, help="decode steps per row")
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from

    table = SplitTable.for_cpu(len(usable_cores()), PdmuxConfig())
    device = CpuDevice(table.groups)
    runner = ModelRunner(load_model(str(default_model_path())), 32768)
    ex = runner
    eos = runner.config.eos_ids
    decoders = [Request(i, [100 + i] * 64, SamplingParams(max_tokens=4000, ignore_eos=True))
                for i in range(args.decode_bs)]
    for r in decoders:
        ex.admit(r)
    state = ex.prefill_begin(decoders)
    device.set_level(0)
    device.run_whole(ex.prefill_work(state, decoders, 0, runner.config.num_layers))
    for r, tok in zip(decoders, ex.prefill_finish(state), strict=True):
        append_token(r, tok, 0.0, eos)

    def decode_steps(level: int, with_prefill: bool) -> list[float]:
        """Decode step times at `level`; `with_prefill` keeps a long prefill running on the prefill side."""
        device.set_level(level)
        times: list[float] = []
        long: tuple[Request, PrefillState] | None = None  # the long prompt in prefill, and its prefill state

        def finish_long() -> None:
            device.wait_prefill()
            if long is not None:
                ex.prefill_finish(long[1])
                ex.free(long[0])

        for _ in range(args.steps):
            if with_prefill and not device.prefill_busy():
                finish_long()
                req = Request(10_000 + len(times), [7] * args.prompt, SamplingParams(max_tokens=1))
                ex.admit(req)
                long = (req, ex.prefill_begin([req]))  # a fresh long prompt
                device.submit_prefill(ex.prefill_work(long[1], [req], 0, runner.config.num_layers))
            t0 = time.perf_counter()
            toks = device.run_decode(ex.decode_work(decoders))  # a side without cores runs on every core
            times.append(time.perf_counter() - t0)
            for r, tok in zip(decoders, toks, strict=True):
                append_token(r, tok, 0.0, eos)
        finish_long()
        return times

    last, split = len(table.groups) - 1, 1
    decode_steps(last, False)  # warm-up
    rows = {
        f"decode on every core {table.groups[last]}": decode_steps(last, False),
        f"decode on its cores {table.groups[split]}": decode_steps(split, False),
        f"+ {args.prompt}-token prefill on the others": decode_steps(split, True),
        "decode time-shared with the prefill": decode_steps(0, True),  # level 0: decode has no cores of its own
    }
    device.close()

    base = statistics.median(next(iter(rows.values())))
    print(f"decode batch {args.decode_bs}, {len(usable_cores())} cores, {args.steps} steps per row; ms")
    print(f"{'':<44}{'median':>9}{'p99':>9}{'median/base':>13}")
    for name, ts in rows.items():
        med = statistics.median(ts)
        print(f"{name:<44}{med * 1e3:>9.1f}{percentile(ts, 99) * 1e3:>9.1f}{med / base:>13.2f}")


if __name__ == "__main__":
    main()
