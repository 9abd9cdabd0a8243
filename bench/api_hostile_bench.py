"""What hostile requests cost the API server: event-loop stall and memory, for one or more pdtop trees.

    .venv/bin/python bench/api_hostile_bench.py [--trees main=/work/wt/base,this=.] [--concurrent 1,6]
                                                [--trailer-mib 20]

Each case runs in a fresh child process (its peak RSS is its own) with the tree's `pdtop` first on
the path: an `ApiServer` on a simulated GPU whose engine does not run, on its own event loop and
thread as in `pdtop serve`, and a probe on that loop that sleeps 1 ms at a time and records how
late it wakes (the stall). A client process sends over raw loopback sockets, all at once:
- the 8 MB bodies of issue 38 item 5 (4.19 M token ids; 320,000 empty content parts; 279,615
  empty chat messages), `--concurrent` of them at a time;
- chunked bodies with `--trailer-mib` trailer fields of 1 MiB, 6 at a time, with and without a
  token set (item 2).
Prints, per case and tree: the answer's status line, the longest stall, RSS before and at peak.
Asserts nothing; quote `uptime` with the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = {
    "ids": ("/v1/completions", lambda: {"prompt": [1] * 4_190_000}),
    "parts": ("/v1/chat/completions",
              lambda: {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 320_000}]}),
    "messages": ("/v1/chat/completions", lambda: {"messages": [{"role": "user", "content": ""}] * 279_615}),
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _read_status(s: socket.socket) -> str:
    s.settimeout(60)
    try:
        head = s.recv(256)
    except OSError as exc:
        return type(exc).__name__
    return head.split(b"\r\n", 1)[0].decode("latin-1") if head else "closed"


def _request(shape: str) -> bytes:
    path, make = SHAPES[shape]
    raw = json.dumps(make(), separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


def _body(port: int, request: bytes, n: int) -> list[str]:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    threads = [threading.Thread(target=s.sendall, args=(request,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [_read_status(s) for s in socks]


def _trailers(port: int, mib: int, n: int = 6) -> list[str]:
    field = b"a" * ((1 << 20) - 32)

    def flood(s: socket.socket) -> None:
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n")
            for i in range(mib):  # 1 MiB trailer fields
                s.sendall(b"X-Trailer-%d: " % i + field + b"\r\n")
            s.sendall(b"\r\n")
        except OSError:
            pass  # refused before the end

    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    threads = [threading.Thread(target=flood, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [_read_status(s) for s in socks]


def child(case: str, concurrent: int, mib: int) -> dict:
    """One case in this process: what came back, the longest stall, RSS."""
    from pdtop.api.server import ApiServer, default_tokenizer
    from pdtop.engine.build import build_engine

    engine = build_engine("sim:H100")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    token = "s3cret" if case == "trailers+token" else None
    api = ApiServer(engine, port=0, token=token, tokenizer=default_tokenizer())
    asyncio.run_coroutine_threadsafe(api.start(), loop).result(30)
    stall = [0.0]
    probing = [True]

    async def probe() -> None:
        while probing[0]:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            stall[0] = max(stall[0], time.perf_counter() - t - 0.001)

    client = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client", f"{case}:{concurrent}:{api.port}",
                               "--trailer-mib", str(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None and client.stdin is not None
    client.stdout.readline()  # its request is built
    before = _rss_mb()
    asyncio.run_coroutine_threadsafe(probe(), loop)
    time.sleep(0.2)
    stall[0] = 0.0
    client.stdin.write("go\n")
    client.stdin.flush()
    statuses = json.loads(client.stdout.readline())
    client.wait()
    time.sleep(0.2)
    probing[0] = False
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    asyncio.run_coroutine_threadsafe(api.stop(), loop).result(30)
    engine.close()
    return {"statuses": sorted(set(statuses)), "stall_ms": stall[0] * 1e3, "rss_before_mb": before,
            "rss_peak_mb": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=f"this={os.path.dirname(HERE)}",
                    help="name=path,...: pdtop trees to compare (default: this one)")
    ap.add_argument("--concurrent", default="1,6", help="bodies sent at once (comma-separated counts)")
    ap.add_argument("--trailer-mib", type=int, default=20, help="1 MiB trailer fields per connection (6 connections)")
    ap.add_argument("--cases", default="ids,parts,messages,trailers,trailers+token")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:  # in its own process: the server's GIL is the server's
        case, n, port = args.client.split(":")
        request = _request(case) if case in SHAPES else b""
        print("ready", flush=True)
        sys.stdin.readline()
        statuses = _body(int(port), request, int(n)) if case in SHAPES else _trailers(int(port), args.trailer_mib)
        print(json.dumps(statuses), flush=True)
        return
    if args.child:
        case, n = args.child.split(":")
        print(json.dumps(child(case, int(n), args.trailer_mib)))
        return
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    print(f"load average before: {os.getloadavg()}")
    print(f"{'case':<22}{'tree':<8}{'answers':<44}{'stall ms':>10}{'RSS MB':>9}{'peak MB':>9}")
    for case in args.cases.split(","):
        counts = [int(c) for c in args.concurrent.split(",")] if case in SHAPES else [6]
        for n in counts:
            for name, path in trees.items():
                env = {**os.environ, "PYTHONPATH": os.path.abspath(path)}
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{case}:{n}",
                                      "--trailer-mib", str(args.trailer_mib)], env=env, capture_output=True,
                                     text=True, timeout=600)
                if out.returncode != 0:
                    print(f"{case} x{n:<4} {name}: failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{f'{case} x{n}':<22}{name:<8}{', '.join(r['statuses'])[:42]:<44}{r['stall_ms']:>10.0f}"
                      f"{r['rss_before_mb']:>9.0f}{r['rss_peak_mb']:>9.0f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
