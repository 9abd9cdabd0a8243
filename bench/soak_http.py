"""The HTTP side of `bench/soak.py`: what the OpenAI-compatible API of the soaked server faces.

- `STREAMS` clients that stream `/v1/completions` one after another (prompts as token ids);
- a slowloris group on other loopback addresses (127.0.0.2, 127.0.0.3): `SLOW_IDLE` sockets
  that only connect and `SLOW_PARTIAL` that send half a request line, each reopened once the
  server closes it (at its header deadline), so the pressure never lets up;
- a client that sends a long prompt every `DROP_EVERY_S` seconds and leaves mid-prefill;
- a `/health` probe every 100 ms on a new connection, timed, in a child process of its own.

Raw asyncio streams, no HTTP library: on a 2-core machine the less CPU the clients take,
the more the figures are the server's.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

STREAMS, SLOW_IDLE, SLOW_PARTIAL = 8, 300, 300  # SLOW_*: the default of --slowloris
DROP_EVERY_S, DROP_PROMPT = 5.0, 8000


def _request(path: str, body: dict | None = None, host: str = "127.0.0.1") -> bytes:
    if body is None:
        return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


class Slowloris:
    """The slowloris groups in a child process (`python bench/soak_http.py HOST PORT N`), so that the bursts
    of reconnects at each header deadline load the server, not the probe's own event loop."""

    def __init__(self, host: str, port: int, n: int) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), host, str(port), str(n)],
                                     stdout=subprocess.PIPE, text=True)

    def stop(self) -> tuple[int, int]:
        """(sockets opened, closed by the server)."""
        self.proc.send_signal(signal.SIGINT)
        out = self.proc.communicate(timeout=30)[0].split()
        return (int(out[0]), int(out[1])) if len(out) == 2 else (0, 0)


@dataclass
class HttpSide:
    host: str
    port: int
    streams_done: int = 0
    stream_tokens: int = 0
    stream_errors: list[str] = field(default_factory=list)
    stream_refused: int = 0  # 503 queue_full: the engine's waiting queue was full (overload, answered as it should)
    slowloris: int = SLOW_IDLE  # sockets in each slowloris group
    slow_opened: int = 0  # slowloris sockets opened (each reopened when the server closes it)
    slow_closed: int = 0  # ... closed by the server
    dropped: int = 0  # long prompts left mid-prefill
    health_ms: list[float] = field(default_factory=list)
    health_failed: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _slow: Slowloris | None = None

    def start(self) -> None:
        self._slow = Slowloris(self.host, self.port, self.slowloris) if self.slowloris else None
        self._tasks += [asyncio.create_task(self._stream(i)) for i in range(STREAMS)]
        self._tasks += [asyncio.create_task(self._drop_mid_prefill()), asyncio.create_task(self._read_probe())]

    async def _read_probe(self) -> None:
        """The /health probe in a child process of its own, so that this process's clients (the websocket
        readers parse every event) do not delay its timing: one line per probe, "ms" or "! why"."""
        child = await asyncio.create_subprocess_exec(sys.executable, os.path.abspath(__file__), "probe", self.host,
                                                     str(self.port), stdout=asyncio.subprocess.PIPE)
        try:
            assert child.stdout is not None
            while line := (await child.stdout.readline()).decode().strip():
                if line.startswith("!"):
                    self.health_failed.append(line[1:].strip())
                else:
                    self.health_ms.append(float(line))
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._slow is not None:
            self.slow_opened, self.slow_closed = self._slow.stop()

    def start_groups(self) -> None:
        """In the slowloris child: both groups."""
        self._tasks += [asyncio.create_task(self._slowloris("127.0.0.2", None)) for _ in range(self.slowloris)]
        self._tasks += [asyncio.create_task(self._slowloris("127.0.0.3", b"GET /health HT"))
                        for _ in range(self.slowloris)]

    async def _stream(self, i: int) -> None:
        rng = random.Random(i)
        while True:
            body = {"prompt": [rng.randrange(1000, 2000) for _ in range(rng.randint(16, 256))], "max_tokens": 64,
                    "ignore_eos": True, "stream": True}
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(_request("/v1/completions", body))
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"HTTP/1.1 503") and b"queue_full" in await reader.read():
                    self.stream_refused += 1
                    await asyncio.sleep(1)  # as its Retry-After says
                elif not head.startswith(b"HTTP/1.1 200"):
                    self.stream_errors.append(head.split(b"\r\n")[0].decode())
                    await asyncio.sleep(1)
                else:
                    data = await reader.read()  # to [DONE] and the end: the request said Connection: close
                    self.stream_tokens += data.count(b'"text"')
                    self.streams_done += 1
                writer.close()
            except (OSError, asyncio.IncompleteReadError) as exc:
                self.stream_errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1)

    async def _slowloris(self, source: str, partial: bytes | None) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port, local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(1)
                continue
            self.slow_opened += 1
            if partial:
                writer.write(partial)
            await reader.read()  # until the server closes it
            self.slow_closed += 1
            writer.close()

    async def _drop_mid_prefill(self) -> None:
        rng = random.Random(99)
        while True:
            await asyncio.sleep(DROP_EVERY_S)
            body = {"prompt": [rng.randrange(1000, 2000) for _ in range(DROP_PROMPT)], "max_tokens": 16,
                    "stream": True}
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(_request("/v1/completions", body))
                head = await reader.readuntil(b"\r\n\r\n")  # accepted, queued: leave before its first token
                writer.transport.abort()
                self.dropped += head.startswith(b"HTTP/1.1 200")
            except (OSError, asyncio.IncompleteReadError):
                pass

    async def _probe(self) -> None:
        while True:
            t0 = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(_request("/health"))
                status = (await reader.readline()).decode().strip()
                await reader.read()
                writer.close()
                print(f"{(time.perf_counter() - t0) * 1e3:.3f}" if status.startswith("HTTP/1.1 200") else
                      f"! {status}", flush=True)
            except OSError as exc:
                print(f"! {type(exc).__name__}: {exc}", flush=True)
            await asyncio.sleep(0.1)

    def health_p99(self) -> float:
        if not self.health_ms:
            return float("nan")
        ordered = sorted(self.health_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    async def aborted(self) -> int:
        """The server's count of requests whose client left (`pdtop:request_success_total{...="abort"}`)."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(_request("/metrics"))
        text = (await reader.read()).decode()
        writer.close()
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("pdtop:request_success_total") and 'finished_reason="abort"' in line))


async def _slowloris_child(host: str, port: int, n: int) -> None:
    side = HttpSide(host, port, slowloris=n)
    side.start_groups()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for t in side._tasks:
        t.cancel()
    await asyncio.gather(*side._tasks, return_exceptions=True)
    print(side.slow_opened, side.slow_closed, flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        if sys.argv[1] == "probe":
            asyncio.run(HttpSide(sys.argv[2], int(sys.argv[3]))._probe())
        else:
            asyncio.run(_slowloris_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
