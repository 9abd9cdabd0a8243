"""What the sources that only read /metrics pages share: no transport, every control refused, and a
close that stops their poll loop (it waits on `_wake`) before each closes its own parts."""
from __future__ import annotations

import asyncio

from pdtop.telemetry.events import Reply
from pdtop.telemetry.server.commands import Command
from pdtop.telemetry.sources.source import ControlRefused


class ReadOnlySource:
    readonly = True
    want_readonly = True
    readonly_reason = "pdtop only reads /metrics: nothing can be changed through it"

    def __init__(self) -> None:
        self.state = "connecting"
        self.last_error: str | None = None
        self.retry_at: float | None = None
        self._closed = False
        self._wake = asyncio.Event()

    @property
    def transport(self) -> None:
        return None

    async def send(self, command: Command) -> Reply:
        raise ControlRefused(None, self.readonly_reason)

    def stop(self) -> None:
        """Tell the poll loop to end at its next wait (it ends even where a cancellation was lost: Python
        3.11's `wait_for` can swallow one that meets its inner task's end)."""
        self._closed = True
        self.state = "closed"
        self._wake.set()

    async def close(self) -> None:
        self.stop()
        await self._close_parts()

    async def _close_parts(self) -> None:
        """Close what the source holds (HTTP clients, members); after the poll loop was told to stop."""
