"""Soak: `pdtop serve` at a high rate for minutes, with 16 clients and a control message every 100 ms,
and its HTTP API under load and attack.

The websocket clients: 13 that read (one of them sends the control messages), 2 that never
read a byte after their handshake, and `pdtop record` writing a gzip recording. The API
(`bench/soak_http.py`): 8 streaming clients, 600 slowloris sockets from two other loopback
addresses (idle, or half a request line; reopened as the server closes them), a client
that leaves a long prompt mid-prefill every 5 s, and a `/health` probe every 100 ms. Every
--interval seconds the table gets a row: the server's RSS and open files, the event rate
and the drops one reading client sees, the engine's waiting queue, the connections still
open, the API streams completed, `/health`'s p99 in that interval.
The run passes when the RSS grew less than 10% after the warm-up, no reading client was
closed, the recording reads back and replays, `/health` answered every probe under 100 ms
at p99 in every interval, every stream completed, the engine aborted each dropped
request, and nothing is left running. (The server closes the 2 stalled
clients, as it should: after about 40 s, when they leave its keepalive pings unanswered, or
with 1008 "not reading" once they leave 1024 config events unread; they see 1006, as they
never read the close frame.) Everything runs on loopback. Exit status 0: passed, 1: failed.

    .venv/bin/python bench/soak.py                        # 10 minutes
    .venv/bin/python bench/soak.py --minutes 3 --rate 100
    .venv/bin/python bench/soak.py --minutes 2 --warmup 30 --rate 50   # a shared 2-core machine
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_http import SLOW_IDLE, STREAMS, HttpSide

READERS, STALLED = 13, 2  # + `pdtop record` = 16 clients
PDTOP = [sys.executable, "-m", "pdtop"]


@dataclass
class Reader:
    """What one reading connection saw."""

    name: str
    ws: ClientConnection | None = None
    events: int = 0
    dropped: int = 0
    waiting: int = 0  # the engine's waiting queue in the last round seen
    replies_ok: int = 0
    replies_refused: int = 0
    closed: str | None = None  # "1008 not reading", set when the server closed it

    async def run(self, url: str) -> None:
        try:
            async with connect(url + "/?batch=1", compression=None, max_size=2**22) as ws:
                self.ws = ws
                async for frame in ws:
                    event = json.loads(frame)
                    for e in event["events"] if event["type"] == "batch" else [event]:
                        self.take(e)
        except ConnectionClosed as exc:
            if exc.rcvd is not None:
                self.closed = f"{exc.rcvd.code} {exc.rcvd.reason}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.closed = f"{type(exc).__name__}: {exc}"
        else:
            if self.ws is not None and self.ws.close_code not in (None, 1000):
                self.closed = f"{self.ws.close_code} {self.ws.close_reason}"

    def take(self, e: dict[str, Any]) -> None:
        self.events += 1
        kind = e.get("type")
        if kind == "dropped":
            self.dropped += e["count"]
        elif kind == "round":
            self.waiting = e["waiting"]
        elif kind == "reply":
            if e["ok"]:
                self.replies_ok += 1
            else:
                self.replies_refused += 1


def control_messages(seed: int = 7) -> Iterator[dict[str, Any]]:
    """A control message for every 100 ms: knobs, levels, pins, policies, now and then a long prompt."""
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        if n % 50 == 0:
            yield {"cmd": "inject", "prompt_tokens": 8192}
            continue
        yield rng.choice([
            {"cmd": "set", "decode_bs_divisor": rng.randint(4, 64)},
            {"cmd": "pin_level", "level": rng.randint(0, 2)},  # every table has at least 3 levels
            {"cmd": "auto_level"},
            {"cmd": "set", "sm_group_num": rng.randint(3, 10)},
            {"cmd": "set", "chunk_size": rng.choice([256, 512, 1024])},
            {"cmd": "set", "policy": rng.choice(["pdmux", "pdmux", "chunked"])},
        ])


async def replay_check(path: Path) -> str:
    """'' if the recording reads back, every event decodes and the last seconds replay; else why not."""
    from pdtop.telemetry.recording.reader import read_recording
    from pdtop.telemetry.sources.replay import ReplaySource
    from pdtop.ui.state import DashboardState

    rec = read_recording(path)
    if rec.problems:
        return "; ".join(rec.problems)
    src = ReplaySource(path, speed=16, hold_at_end=False)
    src.seek(max(0.0, src.duration - 16))  # the last 16 s at 16x
    state = DashboardState()
    async for event in src.events():
        state.ingest(event)
    if state.invalid or state.rounds_seen == 0:
        return f"{state.invalid} events refused, {state.rounds_seen} rounds replayed: {state.invalid_reason}"
    return ""


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    err = (workdir / "serve.stderr").open("w")
    serve = subprocess.Popen([*PDTOP, "serve", "--device", args.device, "--port", "0", "--rate", str(args.rate),
                              "--record-dir", str(workdir), "--api-port", "0"],
                             stdout=subprocess.PIPE, stderr=err, text=True)
    url = serve.stdout.readline().split()[-1]  # type: ignore[union-attr]
    api = serve.stdout.readline().split()[-1].removeprefix("http://").removesuffix("/v1")  # type: ignore[union-attr]
    proc = psutil.Process(serve.pid)
    http = HttpSide(api.rpartition(":")[0], int(api.rpartition(":")[2]), slowloris=args.slowloris)
    http.start()
    recording = workdir / "soak.ndjson.gz"
    record = subprocess.Popen([*PDTOP, "record", url, "-o", str(recording)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    readers = [Reader(f"r{i}") for i in range(READERS)]
    tasks = [asyncio.create_task(r.run(url)) for r in readers]
    # connected, then never read: the library stops reading the socket once one frame is queued
    stalled = [await connect(url, compression=None, max_queue=1, max_size=2**22) for _ in range(STALLED)]
    controller = readers[0]
    messages = control_messages()

    async def control() -> None:
        while controller.ws is None:
            await asyncio.sleep(0.01)
        while True:
            await controller.ws.send(json.dumps(next(messages)))
            await asyncio.sleep(0.1)

    control_task = asyncio.create_task(control())
    watch = readers[1]
    rows: list[tuple[float, float, int, float, int, int, int]] = []
    health_p99s: list[float] = []
    t0 = time.monotonic()
    last_events, last_t = 0, t0
    end = t0 + args.minutes * 60
    print(f"soak: {args.minutes:g} min of `pdtop serve --device {args.device} --rate {args.rate:g}`, "
          f"{READERS} readers + {STALLED} stalled + `pdtop record`, a control message every 100 ms; API: "
          f"{STREAMS} streams, {args.slowloris}+{args.slowloris} slowloris, a drop mid-prefill every 5 s; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'t (s)':>6} {'RSS MB':>8} {'open fds':>9} {'events/s':>9} {'dropped':>8} {'waiting':>8} "
          f"{'connected':>10} {'streams':>8} {'health p99 ms':>14}", flush=True)
    while time.monotonic() < end and serve.poll() is None:
        await asyncio.sleep(max(0.0, min(args.interval, end - time.monotonic())))
        now = time.monotonic()
        rss = proc.memory_info().rss / 2**20
        fds = proc.num_fds()
        rate = (watch.events - last_events) / (now - last_t)
        last_events, last_t = watch.events, now
        connected = sum(r.closed is None for r in readers) + sum(s.close_code is None for s in stalled) + \
            (record.poll() is None)
        rows.append((now - t0, rss, fds, rate, watch.dropped, watch.waiting, connected))
        health_p99s.append(http.health_p99())
        http.health_ms.clear()
        print(f"{now - t0:6.0f} {rss:8.1f} {fds:9d} {rate:9.0f} {watch.dropped:8d} {watch.waiting:8d} "
              f"{connected:>7d}/16 {http.streams_done:8d} {health_p99s[-1]:14.1f}",
              flush=True)

    control_task.cancel()
    await http.stop()
    await asyncio.sleep(1.0)  # the last drop's abort reaches the engine
    aborted = await http.aborted()
    await asyncio.sleep(0.5)
    wrongly_closed = [f"{r.name}: {r.closed}" for r in readers if r.closed]
    stalled_closed = [s for s in stalled if s.close_code is not None]
    for r in readers:
        if r.ws is not None:
            await r.ws.close()
    for s in stalled:
        s.transport.abort()
    await asyncio.gather(*tasks, return_exceptions=True)
    record.send_signal(signal.SIGINT)
    record_err = record.communicate(timeout=30)[1]
    serve.send_signal(signal.SIGINT)
    serve_code = serve.wait(30)
    err.close()

    warm = [row for row in rows if row[0] >= args.warmup] or rows[-1:]
    base, final = warm[0][1], rows[-1][1]
    growth = (final - base) / base
    replay_problem = await replay_check(recording) if recording.exists() else "no recording written"
    serve_log = (workdir / "serve.stderr").read_text().strip().splitlines()
    checks = [
        (f"RSS growth after {warm[0][0]:.0f} s: {base:.1f} -> {final:.1f} MB ({growth:+.1%}; limit +10%)",
         growth < 0.10),
        (f"reading clients wrongly closed: {len(wrongly_closed)} {wrongly_closed or ''}", not wrongly_closed),
        (f"recording {recording.name} ({recording.stat().st_size / 2**20:.1f} MB) reads back and replays"
         + (f": {replay_problem}" if replay_problem else ""), not replay_problem and record.returncode == 0),
        (f"serve exited {serve_code}; its log: {len(serve_log)} lines", serve_code == 0),
        (f"/health p99 per interval: max {max(health_p99s):.1f} ms (limit 100), probes failed: "
         f"{len(http.health_failed)} {http.health_failed[:3] or ''}",
         max(health_p99s) < 100 and not http.health_failed),
        (f"API streams: {http.streams_done} completed ({http.stream_tokens} chunks), {http.stream_refused} "
         f"refused with 503 queue_full (the engine's queue was full), errors: "
         f"{len(http.stream_errors)} {http.stream_errors[:3] or ''}", http.streams_done > 0 and not http.stream_errors),
        (f"slowloris: {http.slow_opened} sockets opened, {http.slow_closed} closed by the server", True),
        (f"dropped mid-prefill: {http.dropped}, aborted by the engine: {aborted}", aborted >= http.dropped > 0),
    ]
    print(f"control messages: {controller.replies_ok} applied, {controller.replies_refused} refused; "
          f"stalled clients closed by the server (expected): {len(stalled_closed)} of {STALLED}")
    for line in serve_log[-5:]:
        print(f"  serve: {line}")
    if record_err.strip():
        print(f"  record: {record_err.strip().splitlines()[-1]}")
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    left = [p.pid for p in psutil.Process().children(recursive=True)] + \
        [p.pid for p in (serve, record) if p.poll() is None]
    checks.append((f"left running: {left or 'nothing'}", not left))
    for text, ok in checks[-1:]:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if all(ok for _, ok in checks) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    ap.add_argument("--rate", type=float, default=100.0, help="requests/s of the workload (default 100)")
    ap.add_argument("--device", default="sim:H100", help="the server's --device (default sim:H100)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument("--slowloris", type=int, default=SLOW_IDLE, metavar="N",
                    help=f"sockets in each of the two slowloris groups (default {SLOW_IDLE})")
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="seconds before the RSS baseline is taken (default 60)")
    ap.add_argument("--keep", metavar="DIR", help="write the recording and the server's log here (default: a "
                    "temporary directory, removed at the end)")
    args = ap.parse_args()
    from pdtop.engine.devices.host import machine_line
    print(machine_line(), flush=True)  # the machine these figures come from
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        return asyncio.run(soak(args, Path(args.keep).resolve()))
    with tempfile.TemporaryDirectory(prefix="pdtop-soak-") as tmp:
        return asyncio.run(soak(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
