"""Write an event stream to an NDJSON recording (gzip when the path ends in `.gz`).

Line 1 is the header `{"format": "pdtop-recording", "format_version": 1, "pdtop": ...,
"started": unix_time, "hello": {...}}`; every later line is `{"t": seconds since start,
"event": {...}}`. Data reaches the OS at least once a second (`flush_interval`), so a
killed process loses at most the last second. Gzip output is flushed with Z_SYNC_FLUSH,
so everything flushed decompresses even when the gzip trailer was never written.

A write that fails (a full disk) raises one `RecordingError` with the reason; the
recorder is then closed, and `close()` does not raise the same failure again.
"""
from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pdtop import __version__

FORMAT = "pdtop-recording"
FORMAT_VERSION = 1


class RecordingError(Exception):
    """A recording cannot be written or read; the message says why, in one line."""


class Recorder:
    def __init__(self, path: str | Path, hello: dict[str, Any], *, file: BinaryIO | None = None,
                 flush_interval: float = 0.5, clock: Callable[[], float] = time.time, name: str | None = None) -> None:
        """Writes to `file` when given (already open, e.g. created inside a recordings directory),
        else creates or truncates `path`. `name`: how errors name the file (a client's own path,
        not where the recordings directory is)."""
        self.path = Path(path)
        self.name = name or str(self.path)
        self.flush_interval = flush_interval
        self._clock = clock
        self._monotonic = time.monotonic
        if file is None:
            try:
                file = open(self.path, "wb")
            except OSError as exc:
                raise self._error(exc) from None
        self._raw: BinaryIO = file
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6) if self.path.suffix == ".gz" else None
        self.started = clock()
        self._t0 = self._monotonic()
        self._last_flush = self._t0
        self.events_written = 0
        self.closed = False
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "pdtop": __version__,
                  "started": self.started, "hello": hello}
        self._write(json.dumps(header, separators=(",", ":")) + "\n")
        self.flush()

    def _error(self, exc: OSError) -> RecordingError:
        return RecordingError(f"cannot write recording {self.name!r}: {exc.strerror or exc}")

    def _failed(self, exc: OSError) -> RecordingError:
        """Close without flushing what cannot be written; the error to raise."""
        self.closed = True
        for f in (self._gz, self._raw):
            try:
                if f is not None:
                    f.close()
            except (OSError, ValueError):
                pass
        return self._error(exc)

    def _write(self, text: str) -> None:
        try:
            (self._gz or self._raw).write(text.encode())
        except OSError as exc:
            raise self._failed(exc) from None

    def elapsed(self) -> float:
        return self._monotonic() - self._t0

    def write(self, event_json: str, t: float | None = None) -> None:
        """Append one already-encoded event; `t` defaults to seconds since the recording started."""
        if self.closed:
            return
        t = self.elapsed() if t is None else t
        self._write(f'{{"t":{round(t, 6)!r},"event":{event_json}}}\n')
        self.events_written += 1
        self.maybe_flush()

    def write_event(self, event: dict[str, Any], t: float | None = None) -> None:
        self.write(json.dumps(event, separators=(",", ":")), t)

    def maybe_flush(self) -> None:
        """Flush when `flush_interval` has passed; owners also call this on a timer."""
        if not self.closed and self._monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        if self.closed:
            return
        try:
            if self._gz is not None:
                self._gz.flush(zlib.Z_SYNC_FLUSH)
            self._raw.flush()
        except OSError as exc:
            raise self._failed(exc) from None
        self._last_flush = self._monotonic()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._gz is not None:
                self._gz.close()
            self._raw.close()
        except OSError as exc:
            raise self._failed(exc) from None
        finally:
            self.closed = True
