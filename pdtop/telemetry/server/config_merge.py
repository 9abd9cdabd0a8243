"""Config events that arrived in one server tick, merged into one.

A client gets one `config` event per tick at most, however many changes the engine applied:
the last event carries the whole configuration anyway, and the merged `changes` keep each
field's first `old` and last `new`. So a burst of control messages cannot fill a reading
client's never-dropped lane and get it closed for not reading.
"""
from __future__ import annotations

import json
from typing import Any

from pdtop.telemetry.encode import encode


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
