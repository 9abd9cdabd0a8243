"""`ReplaySource`: a recording played back as a read-only `Source`.

Events come out at their recorded times scaled by `speed`. `pause`, `resume`, `step`
(release everything up to and including the next `round`), `seek(t)` and the `speed`
setter may be called at any time from the event loop's thread. After a seek the next
event is `{"type": "seek", "v": 1, "position": t, "config": {...}, "totals": {...}, "dropped": n}`
(the configuration in force at `t`, as this pdtop reads it, and the request counts and lost events
as the window below starts: `CountsBefore`), so a consumer can reset what it accumulated; then, at
once and paused or not, the events of the `lookback_s` seconds before `t` (`catching_up` is true
while they come), so the figures over a window are there at the seek point, not only once playback
has run that long.
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pdtop.engine.description import EngineConfig, Totals
from pdtop.engine.records import RequestRecord
from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.encode import wire
from pdtop.telemetry.events import ConfigEvent, Dropped, Hello, Reply, Seek
from pdtop.telemetry.recording.reader import Recording, read_recording
from pdtop.telemetry.server.commands import Command
from pdtop.telemetry.sources.source import ControlRefused

MIN_SPEED, MAX_SPEED = 0.25, 16.0
LOOKBACK_S = 30.0  # the dashboard's window (`DashboardState.window_s`)


class ReplaySource:
    state = "replay"
    readonly = want_readonly = True
    readonly_reason = "a replay cannot change the engine"
    last_error: str | None = None
    retry_at: float | None = None

    def __init__(self, path: str | Path, *, speed: float = 1.0, hold_at_end: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Reads the whole file now (raises `RecordingError`). With `hold_at_end`, `events()`
        waits at the end for a seek or `close()`; otherwise it finishes there."""
        self.recording: Recording = read_recording(path)
        self.url = ""
        self.hold_at_end = hold_at_end
        self._speed = _check_speed(speed)
        self._cursor = 0  # index of the next event to emit
        self._pos = 0.0  # recording time at the anchor
        self._clock = clock
        self._anchor: float | None = clock()  # wall time of the anchor; None while paused
        self._step_to: int | None = None  # while stepping: emit through this index
        self._seek_marker: dict[str, Any] | None = None
        self._catch_up_to = 0  # after a seek: events before this index are released at once
        self.lookback_s = LOOKBACK_S
        self._catching_up = False
        self._closed = False
        self._changed = asyncio.Event()
        self._config_idx = [i for i, t in enumerate(self.recording.types) if t == "config"]
        self._counts = CountsBefore(self.recording)

    # -- what the dashboard shows ------------------------------------------------------
    @property
    def duration(self) -> float:
        return self.recording.duration

    @property
    def skipped(self) -> int:
        return self.recording.skipped

    @property
    def paused(self) -> bool:
        return self._anchor is None

    @property
    def at_end(self) -> bool:
        return self._cursor >= len(self.recording)

    @property
    def position(self) -> float:
        """Seconds into the recording."""
        if self._anchor is None:
            return self._pos
        return min(self.duration, self._pos + (self._clock() - self._anchor) * self._speed)

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        value = _check_speed(value)
        self._rebase()
        self._speed = value
        self._changed.set()

    # -- controls --------------------------------------------------------------------
    def pause(self) -> None:
        if self._anchor is not None:
            self._pos = self.position
            self._anchor = None
            self._changed.set()

    def resume(self) -> None:
        if self._anchor is None:
            self._step_to = None
            self._anchor = self._clock()
            self._changed.set()

    def step(self) -> None:
        """Pause, then release the events up to and including the next `round` (or `metrics`: a scrape)."""
        self.pause()
        types = self.recording.types
        i = self._cursor
        while i < len(types) and types[i] not in ("round", "metrics"):
            i += 1
        self._step_to = min(i, len(types) - 1)
        self._changed.set()

    @property
    def catching_up(self) -> bool:
        """Whether the event just given is from the window before a seek point (replayed at once)."""
        return self._catching_up

    def seek(self, t: float) -> None:
        t = min(max(0.0, float(t)), self.duration)
        times = self.recording.times
        self._catch_up_to = self._cursor = bisect.bisect_left(times, t)
        config = self._config_at()
        self._cursor = bisect.bisect_left(times, t - self.lookback_s)
        totals, dropped = self._counts.before(self._cursor)
        self._pos = t
        if self._anchor is not None:
            self._anchor = self._clock()
        self._step_to = None
        self._seek_marker = wire(Seek(t, config, totals, dropped))
        self._changed.set()

    @property
    def problems(self) -> list[str]:
        return self.recording.problems

    @property
    def transport(self) -> ReplaySource:
        return self

    async def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def send(self, command: Command) -> Reply:
        raise ControlRefused(None, "a replay is read-only")

    # -- the stream ------------------------------------------------------------------
    async def events(self) -> AsyncIterator[dict[str, Any]]:
        yield self.recording.hello
        if self._anchor is not None:  # the clock starts when playback does
            self._anchor = self._clock()
        rec = self.recording
        burst = 0
        while not self._closed:
            if self._seek_marker is not None:
                marker, self._seek_marker = self._seek_marker, None
                yield marker
                continue
            if self._cursor >= len(rec):
                self._pos, self._anchor = self.duration, (None if self._anchor is None else self._clock())
                if not self.hold_at_end:
                    return
                await self._wait(None)
                continue
            i = self._cursor
            if i < self._catch_up_to or (self._step_to is not None and i <= self._step_to):
                due = True
            elif self._anchor is None:
                self._step_to = None
                await self._wait(None)
                continue
            else:
                wait = (rec.times[i] - self.position) / self._speed
                due = wait <= 0
                if not due:
                    await self._wait(wait)
                    continue
            event = rec.event(i)
            self._cursor = i + 1
            self._catching_up = i < self._catch_up_to
            if self._anchor is None and i >= self._catch_up_to:  # stepping: position follows the released events
                self._pos = rec.times[i]
            yield event
            burst += 1
            if burst >= 256:  # a long catch-up still lets the loop breathe
                burst = 0
                await asyncio.sleep(0)

    async def _wait(self, timeout: float | None) -> None:
        self._catching_up = False
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _rebase(self) -> None:
        if self._anchor is not None:
            self._pos = self.position
            self._anchor = self._clock()

    def _config_at(self) -> EngineConfig | None:
        """The configuration of the last readable `config` event before the cursor, else the hello's
        (None for a recording of a scraped /metrics page: no engine configuration)."""
        for i in reversed(self._config_idx[:bisect.bisect_left(self._config_idx, self._cursor)]):
            try:
                event = decode_event(self.recording.event(i))
            except EventError:
                continue
            if isinstance(event, ConfigEvent):
                return event.config
        hello = decode_event(self.recording.hello)  # the reader has checked that it decodes
        return hello.engine.config if isinstance(hello, Hello) and hello.engine else None


class CountsBefore:
    """The request counts (`Totals`, as a dashboard counts them from the `request` events) and the events
    lost (`dropped`) before an event of a recording: the hello's totals (zeros without them) plus what the
    events before it add. Counted once per stretch of `EVERY` events, so seeks about a long file stay cheap."""

    EVERY = 4096

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        hello = decode_event(recording.hello)  # the reader has checked that it decodes
        start = hello.engine.totals if isinstance(hello, Hello) and hello.engine else None
        base = start or Totals(0, 0, 0, 0)
        self._marks: list[tuple[Totals, int]] = [(base, 0)]  # the counts before event k * EVERY

    def before(self, end: int) -> tuple[Totals, int]:
        end = max(0, min(end, len(self.recording)))
        while len(self._marks) <= end // self.EVERY:
            k = len(self._marks) - 1
            self._marks.append(self._count(*self._marks[k], k * self.EVERY, (k + 1) * self.EVERY))
        k = end // self.EVERY
        return self._count(*self._marks[k], k * self.EVERY, end)

    def _count(self, totals: Totals, dropped: int, start: int, end: int) -> tuple[Totals, int]:
        t = dataclasses.replace(totals)
        types = self.recording.types
        for i in range(start, end):
            if types[i] not in ("request", "dropped"):
                continue
            try:
                event = decode_event(self.recording.event(i))
            except EventError:  # the dashboard refuses it too: it counts nothing
                continue
            if isinstance(event, Dropped):
                dropped += event.count
            elif isinstance(event, RequestRecord):
                if event.kind == "arrival":
                    t.arrived += 1
                elif event.kind == "first_token":
                    t.first_token += 1
                elif event.kind == "finish":
                    if event.finish_reason == "rejected":
                        t.rejected += 1
                    else:
                        t.finished += 1
        return t, dropped


def _check_speed(value: float) -> float:
    value = float(value)
    if not MIN_SPEED <= value <= MAX_SPEED:
        raise ValueError(f"speed must be between {MIN_SPEED:g} and {MAX_SPEED:g}, got {value:g}")
    return value
