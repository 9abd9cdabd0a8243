"""How OpenMP team threads should wait: decode and prefill speed per setting, quiet and beside other processes.

torch's OpenMP runtime on Linux is libgomp. Between parallel regions its idle team threads
spin GOMP_SPINCOUNT times (default 300,000; OMP_WAIT_POLICY=ACTIVE: without end; PASSIVE: not
at all) before they sleep. A decode step is hundreds of short regions, so spinning saves a
wake-up per region on a quiet machine; when other processes share the cores, a spinning
thread burns the time slice its partner needs and the step collapses. KMP_BLOCKTIME is Intel
OpenMP's knob: libgomp ignores it. pdtop sets `pdtop.THREAD_WAIT` (see pdtop/__init__.py)
unless the environment already sets one of these.

Each setting runs in a fresh process (the runtime reads it at start), on every core, first
alone and then beside --load busy processes (one per core by default); settings are measured
in turns, --repeats times. Figures: median step time (ms) of decode at batch 1, 8 and 32
(32-token prompts) and the time of one 512-token prefill. Prints a table; asserts nothing.

    .venv/bin/python bench/omp_wait.py [--repeats 2] [--load 2] [--only default,PASSIVE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {  # label -> environment
    "libgomp default (spin 300k)": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=100000": {"GOMP_SPINCOUNT": "100000"},
    "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
    "OMP_WAIT_POLICY=ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
}
KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "PDTOP_THREAD_WAIT")
FIGURES = ("b1", "b8", "b32", "prefill512")


def worker(steps: int) -> None:
    """Runs in the measured process: decode steps at each batch size, then one prefill; JSON to stdout."""
    import torch

    from pdtop.engine.model.loader import load_model
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner
    from pdtop.engine.scheduling.tokens import append_token

    runner = ModelRunner(load_model(None), 8192)
    out: dict[str, float] = {}

    def admitted(i: int, n: int, max_tokens: int) -> Request:
        req = Request(i, [100 + (i * 7 + j) % 30000 for j in range(n)], SamplingParams(max_tokens=max_tokens,
                                                                                      ignore_eos=True))
        runner.admit(req)
        return req

    for bs in (1, 8, 32):
        reqs = [admitted(i, 32, steps + 4) for i in range(bs)]
        for r, t in zip(reqs, runner.prefill(reqs), strict=True):
            append_token(r, t, 0.0, [])
        times = []
        for i in range(steps + 2):
            t0 = time.perf_counter()
            for r, t in zip(reqs, runner.decode(reqs), strict=True):
                append_token(r, t, 0.0, [])
            if i >= 2:
                times.append(time.perf_counter() - t0)
        for r in reqs:
            runner.free(r)
        out[f"b{bs}"] = statistics.median(times) * 1e3
    req = admitted(99, 512, 1)
    t0 = time.perf_counter()
    runner.prefill([req])
    out["prefill512"] = (time.perf_counter() - t0) * 1e3
    out["threads"] = torch.get_num_threads()
    print(json.dumps(out), flush=True)


def measure(env: dict[str, str], steps: int) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if k not in KNOBS}
    clean["PDTOP_THREAD_WAIT"] = "unset"  # pdtop/__init__.py: leave libgomp's own defaults alone
    proc = subprocess.run([sys.executable, __file__, "--worker", str(steps)], env={**clean, **env},
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--load", type=int, default=os.cpu_count(), help="busy processes beside the loaded runs")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed per batch size")
    ap.add_argument("--only", default="", help="comma-separated words: run the settings whose label has one")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    if args.worker is not None:
        worker(args.worker)
        return
    words = [w for w in args.only.split(",") if w]
    settings = {k: v for k, v in SETTINGS.items() if not words or any(w in k for w in words)}
    loads = [os.getloadavg()[0]]
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for loaded in (False, True):
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load if loaded
                                                                                                 else 0)]
            try:
                for label, env in settings.items():
                    results.setdefault((label, loaded), []).append(measure(env, args.steps))
                    print(f"  {label}{' (loaded)' if loaded else ''}: {results[label, loaded][-1]}", file=sys.stderr,
                          flush=True)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
            loads.append(os.getloadavg()[0])
    print(f"median over {args.repeats} runs, ms (decode: one step; prefill: 512 tokens); "
          f"'+load': beside {args.load} busy processes; load average (1 min) {min(loads):.2f}-{max(loads):.2f}")
    head = f"{'setting':30}" + "".join(f"{f:>11}{'+load':>8}" for f in FIGURES)
    print(head)
    for label in settings:
        cells = ""
        for f in FIGURES:
            for loaded in (False, True):
                cells += format(statistics.median(r[f] for r in results[label, loaded]), ">11.1f" if not loaded
                                else ">8.1f")
        print(f"{label:30}{cells}")


if __name__ == "__main__":
    main()
