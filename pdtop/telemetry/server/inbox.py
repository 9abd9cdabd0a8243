"""The hand-off from the engine thread to the event loop, with admission control.

`sink` runs on the engine thread for every record and does little: while the current
tick has room it encodes the record to its JSON text and queues that, otherwise it only
counts the record as shed. Either way the record itself is freed at once: queueing
records instead would keep thousands of young objects alive across garbage
collections, which costs the engine more than the encoding does. The event loop sets
the room once per tick (`refill`) and takes what was admitted (`take`). Config changes
are always admitted, encoded with the configuration captured right after them. An engine
producing tens of thousands of rounds a second (an unpaced simulation) thus costs
telemetry a fixed budget; at real-time pace nothing is shed.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.telemetry.encode import config_event, encode, encode_record


class Outgoing(NamedTuple):
    """One event on its way out, as JSON text. `priority` events (config changes) reach every
    client, never dropped; the others join the stream, which a slow client may lose."""

    text: str
    priority: bool


class Inbox:
    def __init__(self, config_dict: Callable[[], dict[str, Any]]) -> None:
        q: deque[Outgoing] = deque()
        gate = [0, 0]  # [records the current tick may still admit, records shed so far]
        append = q.append

        def sink(record: RoundRecord | RequestRecord | ConfigChange) -> None:
            try:
                if isinstance(record, ConfigChange):
                    append(Outgoing(encode(config_event(record, config_dict())), True))
                elif gate[0] > 0:
                    gate[0] -= 1
                    append(Outgoing(encode_record(record), False))
                else:
                    gate[1] += 1
            except Exception:  # never raise into the engine's loop
                gate[1] += 1

        def publish(event: dict[str, Any]) -> None:
            append(Outgoing(encode(event), False))

        self._q, self._gate = q, gate
        self._shed_taken = 0
        self.sink = sink
        self.publish = publish  # ready-made event dicts (the hardware sampler's); thread-safe

    def refill(self, room: int) -> None:
        """Admit up to `room` more records (set, not added; races only cost a record or two)."""
        self._gate[0] = room

    def take(self) -> tuple[list[Outgoing], int]:
        """What was admitted since the last call, and how many records were shed meanwhile."""
        q = self._q
        items = [q.popleft() for _ in range(len(q))]
        shed_total = self._gate[1]
        shed, self._shed_taken = shed_total - self._shed_taken, shed_total
        return items, shed
