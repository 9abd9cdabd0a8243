"""Who receives the engine's records: `Sinks`, called on the engine thread for every record.

The sinks are a tuple replaced whole, never mutated, so the engine thread iterates it while
another thread adds or removes (one such thread at a time). A sink that raises does not stop
the engine or the other sinks: it is logged the first time with its traceback, then at every
power of two.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from pdtop.engine.records import ConfigChange, KvTransfer, RequestRecord, RoundRecord

Record = RoundRecord | RequestRecord | ConfigChange | KvTransfer
Sink = Callable[[Record], None]

log = logging.getLogger("pdtop.engine")


class Sinks:
    def __init__(self) -> None:
        self.all: tuple[Sink, ...] = ()
        self._failures: dict[Sink, int] = {}  # sinks that raised, and how often

    def add(self, sink: Sink) -> None:
        self.all = (*self.all, sink)

    def remove(self, sink: Sink) -> None:
        self.all = tuple(s for s in self.all if s != sink)

    def emit(self, record: Record) -> None:
        for sink in self.all:
            try:
                sink(record)
            except Exception:  # a broken watcher must not stop the engine
                self._failed(sink)

    def _failed(self, sink: Sink) -> None:
        n = self._failures[sink] = self._failures.get(sink, 0) + 1
        if n == 1:
            log.exception("a sink failed (%r); the engine goes on", sink)
        elif n & (n - 1) == 0:
            log.warning("a sink has failed %d times (%r)", n, sink)
