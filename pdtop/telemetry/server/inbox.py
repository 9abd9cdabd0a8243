"""The hand-off from the engine thread to the event loop, with admission control.

`sink` runs on the engine thread for every record (while anyone listens: the server
takes it off the engine otherwise) and does little: while the current
tick has room it encodes the record to its JSON text and queues that, otherwise it only
counts the record as shed. Either way the record itself is freed at once: queueing
records instead would keep thousands of young objects alive across garbage
collections, which costs the engine more than the encoding does. The event loop sets
the room once per tick (`refill`) and takes what was admitted (`take`). Config changes
are always admitted, encoded with the configuration captured right after them. An engine
producing tens of thousands of rounds a second (an unpaced simulation) thus costs
telemetry a fixed budget; at real-time pace nothing is shed.

A client gets one `config` event per tick at most, however many changes the engine applied
(`merge_configs`): the last event carries the whole configuration anyway, and the merged
`changes` keep each field's first `old` and last `new`. So a burst of control messages cannot
fill a reading client's never-dropped lane and get it closed for not reading.
"""
from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pdtop.engine.description import EngineConfig
from pdtop.engine.records import ConfigChange, KvTransfer, RequestRecord, RoundRecord
from pdtop.telemetry.encode import encode, encode_record
from pdtop.telemetry.events import ConfigEvent, Event

_STREAM = frozenset((RoundRecord, RequestRecord, KvTransfer))


class Outgoing(NamedTuple):
    """One event on its way out, as JSON text. `lane` "config" events reach every client, never
    dropped; "stream" events join the stream, which a slow client may lose."""

    text: str
    lane: str  # "stream" | "config"


@dataclass(slots=True)
class _Gate:
    """The admission counters `sink` reads and writes on the engine thread (slots: as cheap as a list)."""

    room: int = 0  # records the current tick may still admit
    shed: int = 0  # records shed so far


class Inbox:
    def __init__(self, config: Callable[[], EngineConfig]) -> None:
        """`config` gives the configuration in force (`Engine.config_record`), read on the engine thread."""
        q: deque[Outgoing] = deque()
        gate = _Gate()
        append = q.append

        def sink(record: RoundRecord | RequestRecord | ConfigChange | KvTransfer) -> None:
            try:
                if record.__class__ in _STREAM:  # most records: the cheapest test first
                    if gate.room > 0:
                        gate.room -= 1
                        append(Outgoing(encode_record(record), "stream"))  # type: ignore[arg-type]
                    else:
                        gate.shed += 1
                elif isinstance(record, ConfigChange):
                    append(Outgoing(encode(ConfigEvent.after(record, config())), "config"))
            except Exception:  # never raise into the engine's loop
                gate.shed += 1

        def publish(event: Event) -> None:
            append(Outgoing(encode(event), "stream"))

        self._q, self._gate = q, gate
        self.sink = sink
        self.publish = publish  # ready-made events (the hardware sampler's); thread-safe

    def refill(self, room: int) -> None:
        """Admit up to `room` more records (set, not added; races only cost a record or two)."""
        self._gate.room = room

    @property
    def shed_total(self) -> int:
        """Records shed since the start."""
        return self._gate.shed

    def take(self) -> tuple[list[Outgoing], int]:
        """What was admitted since the last call, and `shed_total` (read first: anything shed
        after it was counted is shed after these items)."""
        shed_total = self._gate.shed
        q = self._q
        return [q.popleft() for _ in range(len(q))], shed_total


def merge_configs(texts: list[str]) -> str:
    """Encoded `config` events, oldest first -> one encoded `config` event."""
    if len(texts) == 1:
        return texts[0]
    events = [json.loads(t) for t in texts]
    changes: dict[str, dict[str, Any]] = {}
    for event in events:
        for name, diff in event["changes"].items():
            changes[name] = {"old": changes[name]["old"] if name in changes else diff["old"], "new": diff["new"]}
    clients = {event["client"] for event in events}
    merged = {**events[-1], "changes": changes, "client": clients.pop() if len(clients) == 1 else None}
    return encode(merged)
