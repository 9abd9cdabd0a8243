"""The decode rounds a launched server reports over pdtop's websocket protocol (pdtop serve, or SGLang with
pdtop's plugin on `{control_port}`), read during each `tune --launch` candidate's window and turned into
ITLs: what the SLO is held against where they arrive, instead of each request's TPOT.

A `RoundReader` holds one read-only `LiveSource` connection per server, on a thread of its own (the
candidates' HTTP load runs its own event loop), and keeps the rounds received since `begin()`, at most
`MAX_ROUNDS` (the latest). `window(start, end)` takes those that ended between two `time.perf_counter()`
readings and gives `round_itls` of them. A round carries the server's clock; it is placed on this one by
the smallest lag seen (received - round time, over the rounds kept: the frames come one per server tick,
so some arrive at once), not by when it arrived, which a busy client delays.

ITLs from rounds as the dashboard counts them (`pdtop.telemetry.round_gaps`), which is how pdtop's own tune
counts them from each request's token times; a round missed here is one the server dropped for this slow
client.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass

from pdtop.analysis.metrics import percentile
from pdtop.engine.errors import EngineError
from pdtop.engine.records import RoundRecord
from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.round_gaps import RoundGaps
from pdtop.telemetry.sources.live import LiveSource
from pdtop.tune.score import RoundItls

MAX_ROUNDS = 50_000  # rounds kept per candidate (the latest): 500 s of 10 ms rounds
CONNECT_TIMEOUT_S = 10.0
CATCH_UP_S = 2.0  # how long the rounds up to a window's end may take to arrive after it


@dataclass(frozen=True)
class SeenRound:
    received: float  # time.perf_counter() when it arrived here
    index: int
    time: float  # the server's clock at the round's end
    decode_bs: int
    running: int


def round_itls(rounds: list[SeenRound]) -> RoundItls | None:
    """ITL p50/p99 of `rounds` (in index order; see the module doc); None when no gap was seen."""
    gaps: list[float] = []
    chain = RoundGaps()
    last_index: int | None = None
    for r in rounds:
        gap = chain.after(last_index is not None and r.index == last_index + 1, r.time, r.decode_bs, r.running)
        last_index = r.index
        if gap is not None:
            gaps.extend([gap] * RoundGaps.repeats(r.decode_bs))
    decoded = sum(1 for r in rounds if r.decode_bs > 0)
    if not gaps:
        return None
    return RoundItls(percentile(gaps, 50), percentile(gaps, 99), decoded, len(gaps))


class RoundReader:
    """Rounds from `ws://127.0.0.1:PORT/`, read-only; EngineError (one line) when no hello arrives within
    `connect_timeout_s`, or at once when the port refuses websockets for good (an HTTP error status)."""

    def __init__(self, port: int, token: str | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 max_rounds: int = MAX_ROUNDS) -> None:
        self.source = LiveSource(f"ws://127.0.0.1:{port}/", token, readonly=True, open_timeout=connect_timeout_s)
        self._rounds: deque[SeenRound] = deque(maxlen=max_rounds)
        self._lock = threading.Lock()
        self._hello = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()  # bound to the reader's loop on first use
        self._thread = threading.Thread(target=self._run, name=f"pdtop-tune-rounds-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + connect_timeout_s
        while not self._hello.wait(0.05) and self._thread.is_alive() and time.monotonic() < deadline:
            pass  # a server that refused the connection for good (an HTTP error) ends the reader at once
        if not self._hello.is_set():
            why = self.source.last_error or "no hello"
            when = f" within {connect_timeout_s:g} s" if self._thread.is_alive() else ""
            self.close()
            raise EngineError(f"no pdtop protocol on control port {port}{when}: {why}")

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        """Read until `close()`: then close the connection (its handshake done) and stop reading, also a
        source still connecting."""
        reader = asyncio.create_task(self._read())
        stopper = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            try:
                await asyncio.wait_for(self.source.close(), 2.0)
            except (OSError, TimeoutError):
                pass
            await asyncio.wait({reader}, timeout=1.0)
            reader.cancel()
        stopper.cancel()
        await asyncio.gather(reader, stopper, return_exceptions=True)  # the source giving up ends reading too

    async def _read(self) -> None:
        async for event in self.source.events():
            kind = event.get("type")
            if kind == "hello":
                self._hello.set()
            elif kind == "round":
                try:
                    r = decode_event(event)
                except EventError:
                    continue
                if isinstance(r, RoundRecord) and r.instance != "prefill":  # disagg: the decode instance's
                    seen = SeenRound(time.perf_counter(), r.index, r.time, r.decode_bs, r.running)
                    with self._lock:
                        self._rounds.append(seen)

    def begin(self) -> None:
        """A candidate starts: forget the rounds before."""
        with self._lock:
            self._rounds.clear()

    def rounds_in(self, start: float, end: float, wait_s: float = CATCH_UP_S) -> list[SeenRound]:
        """The rounds kept that ended between `start` and `end` (time.perf_counter()), waiting up to `wait_s`
        for those up to `end` to arrive."""
        deadline = time.perf_counter() + wait_s
        while True:
            with self._lock:
                rounds = list(self._rounds)
            offset = min((r.received - r.time for r in rounds), default=None)
            if (offset is not None and rounds[-1].time + offset >= end) or time.perf_counter() >= deadline:
                break
            time.sleep(0.05)
        return [] if offset is None else [r for r in rounds if start <= r.time + offset <= end]

    def window(self, start: float, end: float) -> RoundItls | None:
        """ITLs of the rounds that ended between `start` and `end`; None if no gap was seen."""
        return round_itls(self.rounds_in(start, end))

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # the loop already closed
                pass
            self._thread.join(timeout=5.0)
