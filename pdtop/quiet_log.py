"""Logging that a flood cannot turn into a flood of log lines (the websocket server, the HTTP API, samplers).

`QuietLog.warning(kind, ...)` logs the first problem of a kind as usual, then only counts
repeats, and says how many there were at most once per `every` seconds (and at `flush`).
A hostile client can make the server refuse things as fast as it can send them: the log
stays a few lines.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class QuietLog:
    def __init__(self, logger: logging.Logger, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.every, self._clock = logger, every, clock
        self._repeats: dict[str, int] = {}  # kind -> repeats not yet reported
        self._since: dict[str, float] = {}  # kind -> when it was last reported

    def warning(self, kind: str, msg: str, *args: Any, exc_info: Any = False) -> None:
        now = self._clock()
        if kind not in self._repeats:
            self._repeats[kind], self._since[kind] = 0, now
            self.logger.warning(msg, *args, exc_info=exc_info)
            return
        self._repeats[kind] += 1
        if now - self._since[kind] >= self.every:
            self._report(kind, now)

    def _report(self, kind: str, now: float) -> None:
        n = self._repeats[kind]
        if n:
            self.logger.warning("%s: %d more in the last %.0f s", kind, n, now - self._since[kind])
        self._repeats[kind], self._since[kind] = 0, now

    def flush(self) -> None:
        """Report every count not reported yet."""
        now = self._clock()
        for kind in list(self._repeats):
            self._report(kind, now)
