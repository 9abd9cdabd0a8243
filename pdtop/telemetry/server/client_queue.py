"""One client's outgoing frames: a bounded stream that drops its oldest, and a short
priority lane (hello, replies, config, errors) that is never dropped.

Used on the event loop's thread only. The engine never waits on it: when the stream
holds more than `max_events` events the oldest frames go and their events are counted;
the writer reports the count with a `dropped` event before the next stream frame.
A stream frame is one event, or a `batch` frame holding `n` events.
"""
from __future__ import annotations

import asyncio
from collections import deque


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
