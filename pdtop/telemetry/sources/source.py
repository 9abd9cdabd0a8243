"""What the dashboard reads: a live connection or a replayed recording (same events)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from pdtop.telemetry.events import Reply


class ControlRefused(Exception):
    """A control message was refused: by the server (its `reply` had ok false) or locally
    (read-only source, not connected). `field` names the offending field or is None."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


@runtime_checkable
class Source(Protocol):
    state: str  # "connecting" | "live" | "reconnecting" | "closed" | "replay"
    readonly: bool

    def events(self) -> AsyncIterator[dict[str, Any]]:
        """Events as received (JSON objects: what `pdtop record` writes), for the consumer to
        decode with `decode_event`; the first is `hello` (again after each reconnect)."""
        ...

    async def send(self, msg: dict[str, Any]) -> Reply:
        """Send a control message; returns the ok reply, raises `ControlRefused` otherwise."""
        ...
