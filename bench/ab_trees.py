"""Before and after, beside each other in one run: a benchmark run alternately on two source trees.

    .venv/bin/python bench/ab_trees.py --base ../pdtop-before --runs 3 telemetry -- --rounds 50000 --repeats 1
    .venv/bin/python bench/ab_trees.py --base ../pdtop-before --runs 3 engine -- --engines pdtop --dtypes float32

Each run imports pdtop from its tree (PYTHONPATH); the runs alternate base, this tree, base, ...
so drift in the machine's load falls on both. Printed: each figure's median over the runs for
both trees, and this tree's / the base's. `telemetry` reads `bench/telemetry_bench.py`'s rounds
per CPU-second of the engine's process for each configuration; `engine` reads
`bench/engine_bench.py`'s pdtop rows (decode tok/s at batch 1 and 32, prefill seconds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def telemetry_figures(out: str) -> dict[str, float]:
    """`label -> rounds per CPU-second` from telemetry_bench's table (its label column is 31 wide)."""
    figures = {}
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("telemetry "))
    for line in lines[start + 1:]:
        if line.startswith("noise:"):
            break
        figures[line[:31].strip()] = float(line[31:].split()[2])
    return figures


def engine_figures(out: str) -> dict[str, float]:
    """`dtype figure -> value` from engine_bench's pdtop rows."""
    figures = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == "pdtop":
            for name, value in zip(("decode b1 tok/s", "decode b32 tok/s", "prefill s"), parts[2:5], strict=True):
                if value != "-":
                    figures[f"{parts[1]} {name}"] = float(value)
    return figures


BENCHES = {"telemetry": ("bench/telemetry_bench.py", telemetry_figures),
           "engine": ("bench/engine_bench.py", engine_figures)}


def run(tree: Path, script: str, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(tree / script), *args], cwd=tree, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"ab_trees: {script} in {tree} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other source tree (a worktree of the older commit)")
    ap.add_argument("--runs", type=int, default=3, help="runs per tree, alternating (default 3)")
    ap.add_argument("bench", choices=sorted(BENCHES))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="after --: the benchmark's own arguments")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))  # this tree's pdtop (the runs set their own PYTHONPATH)
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    script, figures = BENCHES[a.bench]
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    trees = {"base": a.base.resolve(), "this": HERE}
    got: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    load = os.getloadavg()[0]
    for i in range(a.runs):
        for name, tree in trees.items():
            got[name].append(figures(run(tree, script, args)))
            print(f"  run {i + 1}/{a.runs} {name}: " + ", ".join(f"{k} {v:g}" for k, v in got[name][-1].items()),
                  file=sys.stderr, flush=True)
    print(f"pdtop ab_trees: {script} {' '.join(args)}; {a.runs} runs per tree, alternating; "
          f"base {trees['base']}; load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'figure':34} {'base':>10} {'this':>10} {'this/base':>10}")
    for key in got["base"][0]:
        base = statistics.median(r[key] for r in got["base"])
        this = statistics.median(r[key] for r in got["this"])
        print(f"{key:34} {base:10.1f} {this:10.1f} {this / base:9.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
