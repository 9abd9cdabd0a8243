"""Telemetry overhead: engine rounds/s with telemetry off vs on (0, 1, 16 clients).

The engine runs unpaced on the simulated GPU (sim:H100, synthetic:qwen3-8b, a seeded
Poisson workload): every run executes the same rounds, so rounds/s compare directly.
The engine's process (its round thread, the server's event loop, the hardware sampler)
is pinned to --engine-cores (default: all but the last core) and the clients' process
to --client-cores (default: the last), so the clients' own work does not land on the
engine's core. Shown: wall-clock rounds/s; rounds per CPU-second of the engine's process
(what telemetry costs the engine, unblurred by other load on the machine); where that
CPU goes (microseconds per round on the engine thread, the event loop's share of a core);
and the clients' process CPU. Each configuration is measured --repeats times, interleaved;
the median is shown.

    .venv/bin/python bench/telemetry_bench.py [--rounds 150000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from pdtop.engine.engine import Engine

CONFIGS = [  # (label, telemetry on, clients, batch frames)
    ("off", False, 0, True),
    ("on, 0 clients", True, 0, True),
    ("on, 1 client", True, 1, True),
    ("on, 16 clients", True, 16, True),
    ("on, 1 client, 1 frame/event", True, 1, False),
    ("on, 16 clients, 1 frame/event", True, 16, False),
]


def make_engine() -> Engine:
    from pdtop.engine.build import build_engine
    from pdtop.engine.scheduling.workload import WorkloadSpec

    return build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=20.0, seed=3))


def run_rounds(engine: Engine, n: int) -> tuple[float, float, float]:
    """n unpaced rounds on a thread of their own (as `pdtop serve` runs them) -> (wall seconds, CPU
    seconds of this whole process meanwhile: engine + telemetry, CPU seconds of the round thread)."""
    out: list[tuple[float, float, float]] = []

    def work() -> None:
        t0, c0, e0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(n):
            engine.step()
        out.append((time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - e0))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out[0]


def _figures(rounds: int, wall: float, cpu: float, engine_cpu: float, loop_cpu: float) -> dict:
    return {"rounds_per_s": rounds / wall, "rounds_per_cpu_s": rounds / cpu, "engine_us": engine_cpu / rounds * 1e6,
            "loop_share": loop_cpu / wall}


async def measure(rounds: int, on: bool, clients: int, batch: bool, server_kw: dict, client_cores: str) -> dict:
    from pdtop.telemetry.hardware.hw import HwSampler
    from pdtop.telemetry.server.server import TelemetryServer

    engine = make_engine()
    if not on:
        loop0 = time.thread_time()
        wall, cpu, engine_cpu = await asyncio.to_thread(run_rounds, engine, rounds)
        return _figures(rounds, wall, cpu, engine_cpu, time.thread_time() - loop0)
    server = TelemetryServer(engine, port=0, **server_kw)
    await server.start()
    sampler = HwSampler(server.publish).start()
    worker = None
    if clients:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", server.url, str(clients), "1" if batch else "0", client_cores,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert worker.stdout is not None and worker.stdin is not None
        await worker.stdout.readline()  # "ready": every client got its hello
    loop0 = time.thread_time()
    wall, cpu, engine_cpu = await asyncio.to_thread(run_rounds, engine, rounds)
    loop_cpu = time.thread_time() - loop0
    await asyncio.sleep(0.3)  # let the last tick reach the clients
    counts, client_cpu = [], 0.0
    if worker is not None:
        assert worker.stdout is not None and worker.stdin is not None
        worker.stdin.close()
        counts, client_cpu = json.loads((await worker.stdout.readline()).decode())
        await worker.wait()
    sampler.stop()
    await server.stop()
    first = counts[0] if counts else {"events": 0, "dropped": 0}
    return {**_figures(rounds, wall, cpu, engine_cpu, loop_cpu), "client_events_per_s": first["events"] / wall,
            "client_dropped": first["dropped"], "shed": server.events_shed, "client_cpu_share": client_cpu / wall}


async def worker(url: str, n: int, batch: bool, cores: str) -> None:
    """Clients in their own process, on their own cores: connect, count events until stdin closes;
    print the counts and this process's CPU seconds meanwhile."""
    from websockets.asyncio.client import connect

    os.sched_setaffinity(0, _cores(cores))  # before any thread starts: they all inherit it

    counts = [{"events": 0, "dropped": 0} for _ in range(n)]
    q = "/?batch=1" if batch else ""
    conns = [await connect(url + q, compression=None, max_size=2**24) for _ in range(n)]
    for ws in conns:
        await ws.recv()  # hello
    print("ready", flush=True)

    async def read(i: int, ws: ClientConnection) -> None:
        # count without parsing every event, so this process takes little CPU from the engine's
        async for data in ws:
            frame = data if isinstance(data, str) else data.decode()
            n = frame.count('{"type":"')
            if frame.startswith('{"type":"batch"'):
                n -= 1
            if '"type":"dropped"' in frame:
                event = json.loads(frame)
                for e in event["events"] if event["type"] == "batch" else [event]:
                    if e["type"] == "dropped":
                        counts[i]["dropped"] += e["count"]
                        n -= 1
            counts[i]["events"] += n

    readers = [asyncio.create_task(read(i, ws)) for i, ws in enumerate(conns)]
    cpu0 = _cpu_self()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    cpu = _cpu_self() - cpu0
    for ws in conns:
        await ws.close()
    await asyncio.gather(*readers, return_exceptions=True)
    print(json.dumps([counts, cpu]), flush=True)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cores(text: str) -> set[int]:
    return {int(c) for c in text.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=150000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-event-rate", type=float, help="server setting (default: the server's)")
    parser.add_argument("--tick", type=float, help="server setting (default: the server's)")
    cores = sorted(os.sched_getaffinity(0))
    parser.add_argument("--engine-cores", default=",".join(map(str, cores[:-1] or cores)),
                        help="cores of the engine's process (default: all but the last)")
    parser.add_argument("--client-cores", default=str(cores[-1]),
                        help="cores of the clients' process (default: the last)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # its stdout is the parent's protocol: "ready", then the counts
        url, n, batch, client_cores = args.worker
        asyncio.run(worker(url, int(n), batch == "1", client_cores))
        return
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    os.sched_setaffinity(0, _cores(args.engine_cores))  # before any thread starts: they all inherit it
    load_before = os.getloadavg()[0]
    server_kw = {k: v for k, v in (("max_event_rate", args.max_event_rate), ("tick", args.tick)) if v}
    results: dict[str, list[dict]] = {label: [] for label, *_ in CONFIGS}
    for _ in range(args.repeats):
        for label, on, clients, batch in CONFIGS:
            results[label].append(asyncio.run(measure(args.rounds, on, clients, batch, server_kw, args.client_cores)))
    def med(label: str, key: str) -> float:
        return statistics.median(r.get(key, 0) for r in results[label])

    print(f"pdtop telemetry bench: sim:H100 synthetic:qwen3-8b, unpaced, {args.rounds} rounds x {args.repeats} "
          f"(interleaved, medians), server {server_kw or 'defaults'}; engine on cores {args.engine_cores}, clients on "
          f"{args.client_cores}; load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'telemetry':31} {'rounds/s':>9} {'vs off':>7} {'per CPU-s':>9} {'vs off':>7} {'engine us/rnd':>13} "
          f"{'loop':>6} {'clients':>8} {'events/s to client 1':>21} {'shed/s':>7}")
    for label, *_ in CONFIGS:
        m, c = med(label, "rounds_per_s"), med(label, "rounds_per_cpu_s")
        m0, c0 = med("off", "rounds_per_s"), med("off", "rounds_per_cpu_s")
        shed = med(label, "shed") * m / args.rounds
        print(f"{label:31} {m:9.0f} {100 * (m / m0 - 1):+6.1f}% {c:9.0f} {100 * (c / c0 - 1):+6.1f}% "
              f"{med(label, 'engine_us'):13.1f} {100 * med(label, 'loop_share'):5.1f}% "
              f"{100 * med(label, 'client_cpu_share'):7.0f}% {med(label, 'client_events_per_s'):21.0f} {shed:7.0f}")
    off = [r["rounds_per_s"] for r in results["off"]]
    print(f"noise: the 'off' runs alone spread by {100 * (max(off) / min(off) - 1):.0f}% (best/worst). per CPU-s: "
          "rounds / CPU seconds of the engine's process; engine us/rnd: CPU of the round thread per round (sink "
          "included); loop: the event loop's CPU as a share of a core; clients: their process's CPU, same.")


if __name__ == "__main__":
    main()
