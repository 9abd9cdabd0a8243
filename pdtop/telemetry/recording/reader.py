"""Read a recording written by `Recorder` (plain or gzip, detected by content).

Tolerant by design: a gzip stream without its end (the writer was killed) is read up to
the last flush; a corrupt gzip stream is read up to the corrupt spot (`damage` says what
was lost); a truncated last line is dropped (`truncated`); lines that are not
`{"t": finite number, "event": {"type": ...}}`, or whose `t` jumps more than an hour ahead,
are skipped and counted (`skipped`); events
of a protocol version this pdtop does not know are counted (`other_versions`). A file
that is not a recording at all, or whose header's `hello` does not decode, raises
`RecordingError` with a one-line reason. Events are checked where they are consumed
(`decode_event`), so events of types this pdtop does not know stay for the consumer to skip.

The file is read as a stream, line by line, and each event is kept as its line's bytes and
parsed on access: what is held is the events' own bytes and about 60 bytes of bookkeeping
each, with no copy of the whole file beside them. What is read is bounded by what a
recording of pdtop's holds, so that a small hostile file cannot cost more: an event is at
most `MAX_LINE_BYTES` (1 MiB; the largest pdtop writes is a 256-server `fleet`, about 0.5 MB,
and a hello with its configuration is kilobytes), a recording at most `MAX_LINES` lines
(1,000,000: about two hours of a busy `sim:` server, which writes 140 events a second) and
`MAX_BYTES` of events (512 MiB: an hour of that server, 1 KB an event). Past a bound the
rest is not read, and `damage` says so. So a 1 MB gzip file of 64 events padded to 16 MiB
stops at its first line (it took 3.1 GB), and 4 million small events stop at a million
(43 s and 3.5 GB before; 100 MB and 3.4 s of CPU now). A gzip bomb (102 KB of
compressed newlines took 23 s and 1 GB, and was reported clean) stops there too. A gzip
stream without its end is read up to the last flush and reported ("no gzip end"): the
writer was killed, or the file cut.
"""
from __future__ import annotations

import json
import math
import os
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.events import PROTOCOL_VERSION, Hello
from pdtop.telemetry.recording.recorder import FORMAT, FORMAT_VERSION, RecordingError

_fast_loads: Callable[[bytes], Any] | None
_ORJSON_ERROR: type[Exception]
try:  # a fraction of json's cost a line; json reads what orjson refuses (integers past 64 bits)
    import orjson

    _fast_loads, _ORJSON_ERROR = orjson.loads, orjson.JSONDecodeError
except ImportError:  # (the lent GPU machine has no orjson)
    _fast_loads, _ORJSON_ERROR = None, ValueError


def _loads(line: bytes) -> Any:
    """A line's JSON (ValueError or RecursionError when it is none)."""
    if _fast_loads is not None:
        try:
            return _fast_loads(line)
        except _ORJSON_ERROR:
            pass
    return json.loads(line.decode("utf-8", errors="replace"))


_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16
MAX_BYTES = 512 << 20  # NDJSON a replay holds: an hour of a busy sim: server's events (measured 0.52 GB)
MAX_LINES = 1_000_000  # about two hours of that server's 140 events a second
MAX_LINE_BYTES = 1 << 20  # one event (the largest pdtop writes, a 256-server fleet, is about 0.5 MB)
MAX_GAP_S = 3600.0  # a line whose time jumps further ahead is unreadable (the server samples once a second)


@dataclass
class Recording:
    path: Path
    header: dict[str, Any]
    times: array = field(default_factory=lambda: array("d"))  # seconds since start, non-decreasing
    types: list[str] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)  # the raw line of each event
    skipped: int = 0  # unparseable lines skipped
    truncated: bool = False  # the last line was cut off (the writer was killed mid-line)
    damage: str | None = None  # what could not be read of a corrupt gzip file, in one line
    other_versions: dict[int, int] = field(default_factory=dict)  # protocol `v` this pdtop does not read -> events

    @property
    def problems(self) -> list[str]:
        """What was lost or cannot be read, one short phrase each (none for a clean file)."""
        out = [_count(self.skipped, "unreadable line") + " skipped"] if self.skipped else []
        if self.truncated:
            out.append("last line cut off")
        if self.damage:
            out.append(self.damage)
        out += [f"{_count(n, 'event')} of protocol v{v} (this pdtop reads v{PROTOCOL_VERSION})"
                for v, n in sorted(self.other_versions.items())]
        return out

    @property
    def hello(self) -> dict[str, Any]:
        """The header's hello as recorded (what a replay yields first)."""
        return self.header["hello"]

    @property
    def duration(self) -> float:
        return self.times[-1] if self.times else 0.0

    def __len__(self) -> int:
        return len(self.lines)

    def event(self, i: int) -> dict[str, Any]:
        return _loads(self.lines[i])["event"]

    def __iter__(self) -> Iterator[tuple[float, dict[str, Any]]]:
        for i in range(len(self.lines)):
            yield self.times[i], self.event(i)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'s' if n != 1 else ''}"


class _Lines:
    """Whole lines from the pieces of a file, against MAX_BYTES, MAX_LINES and MAX_LINE_BYTES: `feed`
    hands each line to `take` and stops at the first bound crossed (`over` says which, in words)."""

    def __init__(self, take: Callable[[bytes], None]) -> None:
        self.take = take
        self.partial = b""  # the line still being read
        self.bytes = self.lines = 0
        self.over: str | None = None

    def feed(self, piece: bytes) -> bool:
        """Take a piece of the file; False once a bound is crossed (nothing more is taken)."""
        if self.over is not None:
            return False
        if self.bytes + len(piece) > MAX_BYTES:
            piece = piece[:MAX_BYTES - self.bytes]
            self.over = f"more than {MAX_BYTES >> 20:,} MiB of events: the rest is not read"
        self.bytes += len(piece)
        start = 0
        while True:
            end = piece.find(b"\n", start)
            if end < 0:
                if len(self.partial) + len(piece) - start > MAX_LINE_BYTES:
                    self.partial, self.over = b"", f"a line over {MAX_LINE_BYTES >> 20} MiB: the rest is not read"
                    return False
                self.partial += piece[start:]
                return self.over is None
            if len(self.partial) + end - start > MAX_LINE_BYTES:
                self.partial, self.over = b"", f"a line over {MAX_LINE_BYTES >> 20} MiB: the rest is not read"
                return False
            if self.lines >= MAX_LINES:
                self.partial, self.over = b"", f"more than {MAX_LINES:,} lines: the rest is not read"
                return False
            line = self.partial + piece[start:end] if self.partial else piece[start:end]
            self.partial = b""
            self.lines += 1
            self.take(line)
            start = end + 1


def _gzip_pieces(f: BinaryIO, size: int, feed: Callable[[bytes], bool]) -> str | None:
    """Feed the decompressed bytes of the gzip members of file `f` (`size` bytes), read and inflated in
    bounded pieces, until `feed` says stop; what could not be read, in words (None for a whole file). A
    missing end (the writer was killed) loses nothing that was flushed; at a corrupt spot everything
    before it is kept."""
    pos, buf = 0, f.read(_CHUNK)  # pos: the file offset where `buf` starts
    d: Any = None
    while True:
        if d is None:  # a member starts here, or the file ends
            if len(buf) < 2:
                buf += f.read(_CHUNK)
            if not buf:
                return None
            if not buf.startswith(_GZIP_MAGIC):
                return _lost(pos, size, "not gzip data")
            d = zlib.decompressobj(wbits=31)
        chunk, buf = buf or f.read(_CHUNK), b""
        if not chunk:  # the writer never finished this member: keep what was flushed
            return "no gzip end (the writer was stopped, or the file cut): read what was flushed"
        before, given = d.copy(), 0  # given: bytes of this chunk's output already fed
        try:
            piece = d.decompress(chunk, _CHUNK << 4)
            given += len(piece)
            if not feed(piece):
                return None
            while d.unconsumed_tail:  # a chunk that inflates to more than 1 MiB: in bounded steps
                piece = d.decompress(d.unconsumed_tail, _CHUNK << 4)
                given += len(piece)
                if not feed(piece):
                    return None
        except zlib.error:  # again from before this chunk, a byte at a time, to keep all that precedes the fault
            d = before
            for i in range(len(chunk)):
                try:
                    piece = d.decompress(chunk[i:i + 1])
                except zlib.error as exc:
                    return _lost(pos + i, size, str(exc))
                skip = min(given, len(piece))  # fed before the fault was met
                given -= skip
                if piece[skip:] and not feed(piece[skip:]):
                    return None
        pos += len(chunk) - len(d.unused_data)
        if d.eof:  # the rest of the chunk starts the next member (or is not gzip)
            buf, d = d.unused_data, None


def _lost(at: int, size: int, why: str) -> str:
    why = why.removeprefix("Error -3 while decompressing data: ")
    return f"corrupt gzip ({why}): read {at:,} of {size:,} bytes"


def read_recording(path: str | Path) -> Recording:
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as exc:
        raise RecordingError(f"cannot read recording {str(path)!r}: {exc.strerror or exc}") from None
    rec: Recording | None = None
    last_t = 0.0
    types: dict[str, str] = {}  # one string object for each type, not one per event

    def take(line: bytes) -> None:
        nonlocal rec, last_t
        if rec is None:
            rec = Recording(path=path, header=_parse_header(path, line))
            return
        if not line.strip():
            return
        parsed = _parse_line(line)
        if parsed is None:
            rec.skipped += 1
            return
        t, type_, version = parsed
        if t > last_t + MAX_GAP_S:  # `t: 1e300` would hold every later event back for ever
            rec.skipped += 1
            return
        if version.__class__ is int and version != PROTOCOL_VERSION:  # a newer server's: its consumer refuses it
            rec.other_versions[version] = rec.other_versions.get(version, 0) + 1
        last_t = max(last_t, t)
        rec.times.append(last_t)
        rec.types.append(types.setdefault(type_, type_))
        rec.lines.append(line)

    lines = _Lines(take)
    damage = None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            first = f.read(2)
            f.seek(0)
            if first == _GZIP_MAGIC:
                damage = _gzip_pieces(f, size, lines.feed)
            else:
                while (piece := f.read(_CHUNK << 4)) and lines.feed(piece):
                    pass
        except OSError as exc:
            raise RecordingError(f"cannot read recording {str(path)!r}: {exc.strerror or exc}") from None
    tail = lines.partial
    if rec is None:  # no newline at all: the header alone, or not a recording
        take(tail)
        tail = b""
    assert rec is not None
    rec.damage = lines.over or damage
    if tail.strip():  # the last line had no newline: whole if it reads, else cut off
        skipped = rec.skipped
        take(tail)
        if rec.skipped > skipped:
            rec.skipped, rec.truncated = skipped, True
    return rec


def _parse_header(path: Path, line: bytes) -> dict[str, Any]:
    not_rec = f"{str(path)!r} is not a pdtop recording"
    try:
        header = _loads(line)
    except (ValueError, RecursionError):
        raise RecordingError(f"{not_rec} (its first line is not a JSON header)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f'{not_rec} (no "format": "{FORMAT}" header)')
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RecordingError(f"{str(path)!r} has recording format version {version!r}; "
                             f"this pdtop reads up to {FORMAT_VERSION}")
    try:
        hello = decode_event(header.get("hello"))
    except EventError as exc:
        raise RecordingError(f"{str(path)!r}: the hello in its header cannot be read: {exc}") from None
    if not isinstance(hello, Hello):
        raise RecordingError(f"{str(path)!r}: its header holds a {type(hello).__name__} event, not a hello")
    return header


def _parse_line(line: bytes) -> tuple[float, str, Any] | None:
    """A line's time, event type and protocol version, or None if it is not a recorded event."""
    try:
        obj = _loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    t, event = obj.get("t"), obj.get("event")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    return float(t), event["type"], event.get("v")
