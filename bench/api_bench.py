"""What the HTTP API costs: the same streaming workload through the API and directly in the engine.

    .venv/bin/python bench/api_bench.py [--streams 8] [--prompt-tokens 64] [--max-tokens 64] [--repeats 3]

One engine (the real model on this CPU, no synthetic workload) runs rounds on its thread and
the API serves it from an event loop on another, as `pdtop serve --api-port` does. In turns
(API, direct, API, direct, ...):
- API: a lean client in another process sends --streams streaming `/v1/completions` requests
  at once, with prompts as token ids; output tokens / (first request sent to last chunk received);
- direct: the same requests are enqueued in the engine from this process, each at the offset
  from the first at which it reached the engine in the API turn before (the API parses
  requests one by one, and an idle engine starts on the first; the same arrivals give the
  same rounds); output tokens / (first enqueue to last token).
API overhead per token: for every token, the time from the engine appending it (its token
time, `time.perf_counter`) to the client receiving its chunk (the same clock: CLOCK_MONOTONIC
is shared by processes), averaged. Reported with the median of the turns, and the load
average before and after. Prints a table; asserts nothing.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pdtop.api.server import ApiServer
from pdtop.api.streams import Completion
from pdtop.engine.build import build_engine
from pdtop.engine.records import RequestRecord
from pdtop.engine.request import SamplingParams

# A lean client (asyncio streams, no HTTP library): on this 2-core machine it shares the cores with the
# engine, so the less CPU it takes, the more the figures are the server's. One connection per stream.
CLIENT = r"""
import asyncio, json, sys, time

url, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
host, port = url.split("//")[1].split("/")[0].split(":")

async def one(prompt, start):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    await start.wait()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await reader.readuntil(b"\r\n\r\n")  # headers (chunked transfer encoding)
    times = []
    while True:
        size = int((await reader.readline()).strip(), 16)
        data = await reader.readexactly(size + 2)
        times += [time.perf_counter()] * data.count(b"data: {")
        if size == 0 or b"[DONE]" in data:
            break
    writer.close()
    return times

async def main():
    start = asyncio.Event()
    tasks = [asyncio.create_task(one(p, start)) for p in prompts]
    await asyncio.sleep(0.2)  # connected, as a serving client's connections are
    t0 = time.perf_counter()
    start.set()
    arrivals = await asyncio.gather(*tasks)
    print(json.dumps({"t0": t0, "arrivals": arrivals}))

asyncio.run(main())
"""


def token_times(rec: RequestRecord) -> list[float]:
    """Engine-clock time of each token of a finished request, from its finish record."""
    first = rec.time - sum(rec.itls_s)
    out = [first]
    for gap in rec.itls_s:
        out.append(out[-1] + gap)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    load_before = open("/proc/loadavg").read().split()[:3]

    engine = build_engine("cpu")
    records: list[RequestRecord] = []
    engine.add_sink(lambda r: records.append(r) if isinstance(r, RequestRecord) and r.kind == "finish" else None)
    stop = threading.Event()
    engine_thread = threading.Thread(target=engine.run, args=(stop,), daemon=True)
    engine_thread.start()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    api = ApiServer(engine)
    asyncio.run_coroutine_threadsafe(api.start(), loop).result(60)

    # distinct lengths, so each finish record names its prompt
    prompts = [engine.prompts.make(args.prompt_tokens + i) for i in range(args.streams)]
    total = args.streams * args.max_tokens

    def wait_for(n: int) -> list[RequestRecord]:
        while len(records) < n:
            time.sleep(0.001)
        return records[n - args.streams:n]

    def direct(offsets: dict[int, float]) -> float:
        n = len(records) + args.streams
        t0, proc0 = time.perf_counter(), time.process_time()
        for p in sorted(prompts, key=lambda p: offsets[len(p)]):
            time.sleep(max(0.0, t0 + offsets[len(p)] - time.perf_counter()))
            engine.enqueue(p, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True), source="workload")
        done = wait_for(n)
        cpu["process_direct"] += time.process_time() - proc0
        return total / (max(r.time for r in done) - t0)

    async def loop_cpu() -> float:
        return time.thread_time()

    cpu = {"loop": 0.0, "client": 0.0, "process_api": 0.0, "process_direct": 0.0, "on_update": 0.0}
    on_update = Completion.on_update

    def timed_on_update(self: Completion, update: object) -> bool:  # the API's work on the engine thread
        t = time.thread_time()
        try:
            return on_update(self, update)  # type: ignore[arg-type]
        finally:
            cpu["on_update"] += time.thread_time() - t

    Completion.on_update = timed_on_update  # type: ignore[method-assign]

    def through_api() -> tuple[float, list[float], dict[int, float]]:
        n = len(records) + args.streams
        loop0 = asyncio.run_coroutine_threadsafe(loop_cpu(), loop).result()
        child0, proc0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
        out = subprocess.run([sys.executable, "-c", CLIENT, api.url, json.dumps(prompts), str(args.max_tokens)],
                             capture_output=True, text=True, check=True)
        client = json.loads(out.stdout)
        finished = wait_for(n)
        done = {r.prompt_tokens: token_times(r) for r in finished}
        arrived: dict[int, float] = {}
        for r in finished:
            assert r.ttft_s is not None  # set on a finished request
            arrived[r.prompt_tokens] = done[r.prompt_tokens][0] - r.ttft_s
        offsets = {k: t - min(arrived.values()) for k, t in arrived.items()}
        child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu["client"] += child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime
        cpu["loop"] += asyncio.run_coroutine_threadsafe(loop_cpu(), loop).result() - loop0
        cpu["process_api"] += time.process_time() - proc0
        delays = []
        for prompt, arrivals in zip(prompts, client["arrivals"], strict=True):
            delays += [a - t for a, t in zip(arrivals, done[len(prompt)], strict=True)]
        return total / (max(max(a) for a in client["arrivals"]) - client["t0"]), delays, offsets

    direct(through_api()[2])  # warm-up: first-call costs out of the figures
    cpu = dict.fromkeys(cpu, 0.0)
    rates_direct, rates_api, delays = [], [], []
    for _ in range(args.repeats):
        rate, turn_delays, offsets = through_api()
        rates_api.append(rate)
        delays += turn_delays
        rates_direct.append(direct(offsets))

    asyncio.run_coroutine_threadsafe(api.stop(), loop).result(30)
    stop.set()
    engine_thread.join(30)
    engine.close()
    load_after = open("/proc/loadavg").read().split()[:3]

    d, a = statistics.median(rates_direct), statistics.median(rates_api)
    print(f"api_bench: {args.streams} streams x {args.max_tokens} tokens, {args.prompt_tokens}-token prompts, "
          f"{engine.model_name} on {engine.device.describe().name}, {args.repeats} turns")
    print(f"{'output tok/s direct (median)':<40}{d:>10.1f}   turns: {', '.join(f'{x:.1f}' for x in rates_direct)}")
    print(f"{'output tok/s through the API (median)':<40}{a:>10.1f}   "
          f"turns: {', '.join(f'{x:.1f}' for x in rates_api)}")
    print(f"{'API / direct':<40}{a / d:>10.3f}")
    print(f"{'API overhead per token, mean (ms)':<40}{statistics.mean(delays) * 1e3:>10.3f}   "
          f"median {statistics.median(delays) * 1e3:.3f}, p99 {sorted(delays)[int(0.99 * len(delays))] * 1e3:.3f} "
          f"({len(delays)} tokens)")
    per_token = {k: v / (total * args.repeats) * 1e3 for k, v in cpu.items()}
    print(f"{'API CPU ms per token (server)':<40}{per_token['loop'] + per_token['on_update']:>10.3f}   "
          f"event loop {per_token['loop']:.3f}, engine thread (text, stop strings) {per_token['on_update']:.3f}")
    print(f"{'CPU ms per token: engine process':<40}{per_token['process_direct']:>10.3f} direct, "
          f"{per_token['process_api']:.3f} API")
    print(f"{'CPU ms per token: client process':<40}{per_token['client']:>10.3f}")
    print(f"{'load average before / after':<40}{' '.join(load_before)} / {' '.join(load_after)}")


if __name__ == "__main__":
    main()
