"""The hand-off from the engine thread to the event loop, and load shedding.

`sink` runs on the engine thread for every record, so it only appends to a deque (a
`ConfigChange` also captures the configuration right after it). The event loop calls
`take(cap)` once per tick: it returns at most `cap` items, the newest, and how many
older ones it shed. Config changes are never shed. Shedding is what keeps an engine
producing tens of thousands of rounds a second (an unpaced simulation) from spending
its time on telemetry; at real-time pace nothing is shed.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

from pdtop.engine.records import ConfigChange


class Inbox:
    def __init__(self, config_dict: Callable[[], dict[str, Any]]) -> None:
        self._q: deque[Any] = deque()
        append, cc = self._q.append, ConfigChange

        def sink(record: Any) -> None:
            if record.__class__ is cc:
                append((record, config_dict()))
            else:
                append(record)

        self.sink = sink
        self.publish = append  # ready-made event dicts (the hardware sampler's); thread-safe

    def __len__(self) -> int:
        return len(self._q)

    def take(self, cap: int) -> tuple[list[Any], int]:
        """Everything queued so far, cut to the newest `cap` (config changes always kept)."""
        q = self._q
        n = len(q)  # items appended after this read wait for the next tick
        items = [q.popleft() for _ in range(n)]
        if n <= cap:
            return items, 0
        old, items = items[: n - cap], items[n - cap:]
        kept = [it for it in old if it.__class__ is tuple]
        return kept + items, len(old) - len(kept)
