"""A connection as the server keeps it (`Client`, its outgoing `ClientQueue` and its control
rate `TokenBucket`), and how the stream reaches every connection (`fan_out`): the same
encoded text for all, as one `batch` frame written straight to the socket of a caught-up batch
client, else through the client's bounded queue and writer task.

A client's queue holds a bounded stream that drops its oldest, and a short priority lane (hello,
replies, config, errors) that is never dropped. It is used on the event loop's thread only; the
engine never waits on it: when the stream holds more than `max_events` events the oldest frames
go and their events are counted; the writer reports the count with a `dropped` event before the
next stream frame. A stream frame is one event, or a `batch` frame holding `n` events.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection, broadcast

from pdtop.telemetry.encode import encode
from pdtop.telemetry.events import PROTOCOL_VERSION, Dropped

DIRECT_WRITE_LIMIT = 32 * 1024  # websockets' default high-water mark: above it, queue instead
CONTROL_RATE, CONTROL_BURST = 20.0, 40.0  # control messages a second per connection


class QueueOverflow(Exception):
    """The priority lane overflowed: the client has stopped reading."""


class ClientQueue:
    def __init__(self, max_events: int = 1024, priority_max: int = 1024) -> None:
        if max_events < 1:
            raise ValueError("queue size must be at least 1")
        self.max_events = max_events
        self.priority_max = priority_max
        self.stream: deque[tuple[str, int]] = deque()
        self.priority: deque[str] = deque()
        self.events = 0  # events held in `stream`
        self.dropped = 0  # events lost since the last `dropped` event
        self.dropped_total = 0
        self.wake = asyncio.Event()

    def put(self, frame: str, n: int = 1) -> None:
        self.stream.append((frame, n))
        self.events += n
        while self.events > self.max_events and len(self.stream) > 1:
            _, lost = self.stream.popleft()
            self.events -= lost
            self.lose(lost)
        self.wake.set()

    def lose(self, n: int) -> None:
        """Count events this client will not get (also used for events shed upstream)."""
        self.dropped += n
        self.dropped_total += n
        self.wake.set()

    def put_priority(self, frame: str) -> None:
        if len(self.priority) >= self.priority_max:
            raise QueueOverflow(f"{len(self.priority)} replies and notices unread")
        self.priority.append(frame)
        self.wake.set()

    def pop_stream(self) -> str:
        frame, n = self.stream.popleft()
        self.events -= n
        return frame

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def __bool__(self) -> bool:
        return bool(self.stream or self.priority or self.dropped)


class TokenBucket:
    """At most `rate` actions a second on average, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._last = burst, clock()

    def take(self) -> bool:
        """Spend one token if there is one."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(eq=False)
class Client:
    """The server's record of one connection."""

    id: str
    ws: ServerConnection
    queue: ClientQueue
    authorized: bool  # may send control messages
    batch: bool  # asked for `batch` frames
    host: str = ""  # the peer's address: where its wrong tokens are counted (`TokenGate`)
    shed_base: int = 0  # the inbox's shed count when it connected: what was shed before is not its loss
    frames_sent: int = 0
    closing: bool = False  # being closed for not reading: its messages are no longer handled
    waiting: int = 0  # its engine commands whose outcome the engine has not given yet
    messages: TokenBucket = field(default_factory=lambda: TokenBucket(CONTROL_RATE, CONTROL_BURST))


def fan_out(clients: list[Client], frames: list[str], shed_before: int, shed_total: int) -> None:
    """The same text to every client. A batch client that is caught up (nothing queued,
    little unsent) gets its batch written straight to its socket in one `broadcast` call,
    no task switch; every other client's frames go through its queue and writer task.
    A client is told only of events shed since it connected."""
    shed = shed_total - shed_before
    direct: list[ServerConnection] = []
    batch = None
    for client in clients:
        if client.closing:
            continue
        q = client.queue
        lost = shed_total - max(shed_before, client.shed_base)
        if client.batch and not q and lost == shed and _unsent(client.ws) < DIRECT_WRITE_LIMIT:
            direct.append(client.ws)
            client.frames_sent += 1
            continue
        if lost > 0:
            q.lose(lost)
        if not frames:
            continue
        if client.batch:
            batch = batch or _batch(frames)
            q.put(batch, len(frames))
        else:
            for frame in frames:
                q.put(frame)
    if direct:
        lost_note = [encode(Dropped(shed))] if shed else []
        broadcast(direct, _batch(lost_note + frames))


def _batch(frames: list[str]) -> str:
    return f'{{"type":"batch","v":{PROTOCOL_VERSION},"events":[{",".join(frames)}]}}'


def _unsent(ws: ServerConnection) -> int:
    """Bytes written to the socket's transport but not yet sent (huge if it is gone)."""
    try:
        return ws.transport.get_write_buffer_size()
    except Exception:
        return 1 << 62
