"""One client's outgoing frames: a bounded stream that drops its oldest, and a short
priority lane (hello, replies, config, errors) that is never dropped.

Used on the event loop's thread only. The engine never waits on it: a full stream
drops its oldest frame and counts it; the writer reports the count with a `dropped`
event before the next stream frame.
"""
from __future__ import annotations

import asyncio
from collections import deque


class QueueOverflow(Exception):
    """The priority lane overflowed: the client has stopped reading."""


class ClientQueue:
    def __init__(self, maxlen: int = 1024, priority_maxlen: int = 1024) -> None:
        if maxlen < 1:
            raise ValueError("queue size must be at least 1")
        self.maxlen = maxlen
        self.priority_maxlen = priority_maxlen
        self.stream: deque[str] = deque()
        self.priority: deque[str] = deque()
        self.dropped = 0  # dropped since the last `dropped` event
        self.dropped_total = 0
        self.sent = 0
        self.wake = asyncio.Event()

    def put(self, frame: str) -> None:
        if len(self.stream) >= self.maxlen:
            self.stream.popleft()
            self.dropped += 1
            self.dropped_total += 1
        self.stream.append(frame)
        self.wake.set()

    def put_priority(self, frame: str) -> None:
        if len(self.priority) >= self.priority_maxlen:
            raise QueueOverflow(f"{len(self.priority)} replies and notices unread")
        self.priority.append(frame)
        self.wake.set()

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def __len__(self) -> int:
        return len(self.stream) + len(self.priority)
