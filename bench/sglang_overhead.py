"""pdtop's SGLang plugin: what it adds to SGLang's scheduler, in microseconds per round, side by side.

SGLang 0.5.23's own code (its `HookRegistry`, `load_plugins()`, `adjust_stream_groups`) on the CPU
stand-ins of tests/sglang_plugin/cpu_sglang.py, in the steady state of a pdmux server: a decode batch
of --decode-bs requests and a split prefill in flight. A round makes the calls SGLang's pdmux loop
makes each round (`process_input_requests`, `run_batch` for the decode step and for the prefill's
slice, `process_batch_result` of the decode step) plus one `adjust_stream_groups`, which SGLang calls
only at its switch points (so every round switching is the worst case). Rounds are paced at
--round-ms, as a real server's are, so pdtop's server publishes every one.

Configurations, each --repeats times, interleaved (medians shown):
- `SGLang alone`: the functions beneath pdtop's hooks, i.e. what runs with the plugin off;
- `plugin off`: a fresh process (run first, alone) whose `load_plugins()` finds pdtop without
  PDTOP_SGLANG_PORT: it registers nothing, so the functions are SGLang's own objects (said, and timed);
- `plugin on` with 0, 1 and 16 websocket clients (in another process): the hooks, the round records,
  the server's fan-out on its own thread (which takes the GIL from the scheduler now and then).
Columns: CPU microseconds per round on the scheduler thread (`adjust` alone, and the whole round), the
round's wall time (what delays SGLang: the CPU plus waits for the GIL while pdtop's server thread
holds it), and CPU microseconds per round of the whole process (the server thread included). The
clients ask for one frame a tick (`?batch=1`), as pdtop's dashboard and recorder do.
The goal: under 100 us a round (1% of a 10 ms round), nothing when the plugin is off.

    .venv/bin/python bench/sglang_overhead.py [--rounds 3000] [--round-ms 1] [--decode-bs 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this repository's pdtop and the stand-ins of its tests

YAML = "sm_group_num: 8\ndecode_bs_divisor: 36\nsplit_forward_token_budget: 65536\n"
HOOKED = ("process_input_requests", "run_batch", "process_batch_result", "adjust_stream_groups")


def setup(enabled: bool, decode_bs: int) -> tuple[Any, dict[str, Any], dict[str, Any], Any, Any, str | None]:
    """SGLang's scheduler as a pdmux server in steady state, loaded with `load_plugins()` (PDTOP_SGLANG_PORT set
    or not) -> (scheduler, hooked functions, the functions beneath them, decode batch, prefill batch, url)."""
    from tests.sglang_plugin import cpu_sglang as cs

    cs.sglang_or_skip()
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.plugins import load_plugins

    from pdtop.sglang_plugin import entry

    os.environ["HF_HUB_OFFLINE"] = "1"
    if enabled:
        os.environ["PDTOP_SGLANG_PORT"] = "0"
    else:
        os.environ.pop("PDTOP_SGLANG_PORT", None)
    own = {name: getattr(Scheduler, name) for name in HOOKED}
    cs.register_stand_ins()
    load_plugins()
    s = cs.make_scheduler(cs.publish_server_args(Path(tempfile.mkdtemp()), YAML))
    s.init_pdmux()
    s.cpu_thread = types.SimpleNamespace(forwards=deque(maxlen=8))
    s.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(update_decode_attn_backend=lambda i: None))
    decode = cs.Batch([cs.Req(f"d{i}", [5] * 512, 10**9) for i in range(decode_bs)], ForwardMode.DECODE)
    s.running_batch = decode
    split = cs.Batch([cs.Req("p", [5] * 8192, 2)], ForwardMode.SPLIT_PREFILL)
    split.split_index, split.split_forward_count = 8, 4
    s.split_prefill_batch = split
    hooked = {name: getattr(Scheduler, name) for name in HOOKED}
    beneath = {name: getattr(fn, "__wrapped__", fn) if enabled else fn for name, fn in hooked.items()}
    if not enabled:
        same = [name for name in ("adjust_stream_groups",) if hooked[name] is own[name]]
        assert same == ["adjust_stream_groups"], "plugin off, yet SGLang's adjust_stream_groups was replaced"
    servers = getattr(entry.installed, "servers", [])
    return s, hooked, beneath, decode, split, servers[0].url if servers else None


def rounds(s: Any, fns: dict[str, Any], decode: Any, split: Any, n: int, round_s: float) -> dict[str, float]:
    """`n` paced rounds -> microseconds per round: the scheduler thread's CPU for the round, for `adjust`
    alone, and the whole process's CPU over the run."""
    pir, run, result, adjust = (fns[name] for name in HOOKED)
    tick = time.perf_counter()
    cpu0 = time.process_time()
    own = adj = wall = 0.0
    for i in range(n):
        if i % 256 == 0:  # keep the stand-in's sampled tokens from growing without end
            for r in decode.reqs:
                r.output_ids.clear()
        w0, t0 = time.perf_counter(), time.thread_time()
        pir(s, [])
        run(s, decode)
        run(s, split)
        result(s, decode, "result")
        t1 = time.thread_time()
        adjust(s, decode)
        t2, w2 = time.thread_time(), time.perf_counter()
        own += t2 - t0
        adj += t2 - t1
        wall += w2 - w0
        tick += round_s
        pause = tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return {"round_us": own / n * 1e6, "adjust_us": adj / n * 1e6, "wall_us": wall / n * 1e6,
            "process_us": (time.process_time() - cpu0) / n * 1e6}


CLIENTS = """
import asyncio, sys
from websockets.asyncio.client import connect
async def main(url, n):
    conns = [await connect(url + "/?batch=1", compression=None, max_size=2**24) for _ in range(n)]
    for ws in conns:
        await ws.recv()
    print("ready", flush=True)
    async def read(ws):
        async for _ in ws:
            pass
    tasks = [asyncio.create_task(read(ws)) for ws in conns]
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for ws in conns:
        await ws.close()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def with_clients(url: str | None, n: int) -> subprocess.Popen[str] | None:
    if not n or url is None:
        return None
    proc = subprocess.Popen([sys.executable, "-c", CLIENTS, url, str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # the server registers its sink with the first client
    return proc


def off_child(args: argparse.Namespace) -> None:
    """`plugin off`, in a process of its own (SGLang's hooks, once applied, stay for the process)."""
    s, hooked, _, decode, split, url = setup(False, args.decode_bs)
    assert url is None
    out = [rounds(s, hooked, decode, split, args.rounds, args.round_ms / 1e3) for _ in range(args.repeats)]
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--round-ms", type=float, default=1.0, help="pace of the rounds (SGLang's are ~10 ms)")
    ap.add_argument("--decode-bs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--off-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.off_child:
        off_child(args)
        return
    load = os.getloadavg()
    print(f"SGLang plugin overhead: {args.rounds} rounds at {args.round_ms:g} ms, decode batch {args.decode_bs}, "
          f"a split prefill in flight, {args.repeats} repeats (median); load average {load[0]:.2f}", flush=True)
    # first, alone on the machine: the plugin off, in a process of its own
    off = subprocess.run([sys.executable, __file__, "--off-child", *sys.argv[1:]], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    s, hooked, beneath, decode, split, url = setup(True, args.decode_bs)
    results: dict[str, list[dict[str, float]]] = {}
    configs = [("SGLang alone (beneath the hooks)", beneath, 0), ("plugin on, 0 clients", hooked, 0),
               ("plugin on, 1 client", hooked, 1), ("plugin on, 16 clients", hooked, 16)]
    for _ in range(args.repeats):
        for label, fns, n in configs:
            clients = with_clients(url, n)
            try:
                results.setdefault(label, []).append(rounds(s, fns, decode, split, args.rounds, args.round_ms / 1e3))
            finally:
                if clients is not None:
                    clients.communicate("")
    results["plugin off (a fresh process)"] = json.loads(off)
    base = statistics.median(r["round_us"] for r in results[configs[0][0]])
    base_wall = statistics.median(r["wall_us"] for r in results[configs[0][0]])
    print(f"{'':36} {'round CPU us':>12} {'adjust':>7} {'added':>7} {'round wall us':>14} {'added':>7} "
          f"{'process CPU us':>15}")
    for label in [c[0] for c in configs[:1]] + ["plugin off (a fresh process)"] + [c[0] for c in configs[1:]]:
        med = {k: statistics.median(r[k] for r in results[label])
               for k in ("round_us", "adjust_us", "wall_us", "process_us")}
        print(f"{label:36} {med['round_us']:12.1f} {med['adjust_us']:7.1f} {med['round_us'] - base:+7.1f} "
              f"{med['wall_us']:14.1f} {med['wall_us'] - base_wall:+7.1f} {med['process_us']:15.1f}")
    print("plugin off: load_plugins() registered nothing; SGLang's adjust_stream_groups is its own object")


if __name__ == "__main__":
    main()
