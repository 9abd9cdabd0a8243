"""What the dashboard reads: a live connection, a replayed recording or a scraped /metrics page.

Every source yields the same events and says the same things about itself (`Source`); a
replay also has a transport (`Transport`: pause, step, seek, speed), the others none.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from pdtop.telemetry.events import Reply
from pdtop.telemetry.server.commands import Command


class ControlRefused(Exception):
    """A control command was refused: by the server (its `reply` had ok false) or locally
    (read-only source, not connected). `field` names the offending field or is None."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


class Transport(Protocol):
    """Playback of a recording: where it is, and the operator's controls."""

    @property
    def position(self) -> float: ...  # seconds into the recording

    @property
    def duration(self) -> float: ...

    @property
    def paused(self) -> bool: ...

    @property
    def at_end(self) -> bool: ...

    @property
    def problems(self) -> list[str]: ...  # what of the file could not be read, in words

    @property
    def catching_up(self) -> bool: ...  # the event just given replays the window before a seek point

    speed: float

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def step(self) -> None: ...

    def seek(self, t: float) -> None: ...


@runtime_checkable
class Source(Protocol):
    @property
    def state(self) -> str: ...  # "connecting" | "live" | "reconnecting" | "closed" | "replay"

    @property
    def readonly(self) -> bool: ...  # control refused: asked for, told by the server, or a source that cannot

    @property
    def want_readonly(self) -> bool: ...  # the operator asked for a read-only connection

    @property
    def readonly_reason(self) -> str | None: ...  # why control is refused, in words, where the source knows

    @property
    def url(self) -> str: ...  # where the events come from, as shown ("" for a file)

    @property
    def last_error(self) -> str | None: ...  # why the latest connection attempt failed (None once connected)

    @property
    def retry_at(self) -> float | None: ...  # time.monotonic() of the next attempt after a failure

    @property
    def transport(self) -> Transport | None:
        """The replay's controls; None for a live source."""
        ...

    def events(self) -> AsyncIterator[dict[str, Any]]:
        """Events as received (JSON objects: what `pdtop record` writes), for the consumer to
        decode with `decode_event`; the first is `hello` (again after each reconnect)."""
        ...

    async def send(self, command: Command) -> Reply:
        """Send a control command; returns the ok reply, raises `ControlRefused` otherwise."""
        ...

    async def close(self) -> None:
        """Stop: a live source closes its connection (events() then ends)."""
        ...
