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

Events are kept as their JSON text and parsed on access, so a long recording costs
about its own size in memory. What is read is bounded by what a recording can hold
(`MAX_BYTES` of NDJSON, `MAX_LINES` lines, none over `MAX_LINE_BYTES`): past a bound the
rest is not read, and `damage` says so. A gzip bomb (102 KB of compressed newlines took
23 s and 1 GB, and was reported clean) stops there. A gzip stream without its end is read
up to the last flush and reported ("no gzip end"): the writer was killed, or the file cut.
"""
from __future__ import annotations

import json
import math
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.events import PROTOCOL_VERSION, Hello
from pdtop.telemetry.recording.recorder import FORMAT, FORMAT_VERSION, RecordingError

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16
MAX_BYTES = 1 << 30  # NDJSON a replay reads: an hour of a busy sim: server's events
MAX_LINES = 4_000_000
MAX_LINE_BYTES = 16 << 20  # one event (a hello with its config is the largest: kilobytes)
MAX_GAP_S = 3600.0  # a line whose time jumps further ahead is unreadable (the server samples once a second)


@dataclass
class Recording:
    path: Path
    header: dict[str, Any]
    times: array = field(default_factory=lambda: array("d"))  # seconds since start, non-decreasing
    types: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the raw line of each event
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
        return json.loads(self.lines[i])["event"]

    def __iter__(self) -> Iterator[tuple[float, dict[str, Any]]]:
        for i in range(len(self.lines)):
            yield self.times[i], self.event(i)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'s' if n != 1 else ''}"


class _Bounds:
    """What has been read, against MAX_BYTES, MAX_LINES and MAX_LINE_BYTES; `take` cuts a piece at the first
    bound it crosses and `over` says which, in words."""

    def __init__(self) -> None:
        self.bytes = self.lines = self.run = 0  # run: bytes since the last newline
        self.over: str | None = None

    def take(self, piece: bytes) -> bytes:
        newlines = piece.count(b"\n")
        first = piece.find(b"\n")
        run = self.run + (first if first >= 0 else len(piece))
        if run > MAX_LINE_BYTES:
            self.over = f"a line over {MAX_LINE_BYTES >> 20} MiB: the rest is not read"
            return piece[:max(0, first)] if first >= 0 and self.run + first <= MAX_LINE_BYTES else b""
        if self.lines + newlines > MAX_LINES:
            keep = MAX_LINES - self.lines
            self.over = f"more than {MAX_LINES:,} lines: the rest is not read"
            return b"\n".join(piece.split(b"\n", keep)[:keep]) + b"\n" if keep else b""
        if self.bytes + len(piece) > MAX_BYTES:
            self.over = f"more than {MAX_BYTES >> 20:,} MiB of events: the rest is not read"
            return piece[:MAX_BYTES - self.bytes]
        self.bytes += len(piece)
        self.lines += newlines
        self.run = run if first < 0 else len(piece) - 1 - piece.rfind(b"\n")
        return piece


def _decompress_tolerant(data: bytes) -> tuple[bytes, str | None]:
    """Gzip members in sequence, and what was lost. A missing end (the writer was killed) loses
    nothing that was flushed; at a corrupt spot everything before it is kept; past a bound
    (`_Bounds`) nothing more is decompressed."""
    out: list[bytes] = []
    bounds = _Bounds()

    def keep(piece: bytes) -> bool:
        out.append(bounds.take(piece))
        return bounds.over is None

    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        while pos < len(data) and not d.eof:
            chunk = data[pos:pos + _CHUNK]
            before, mark, counts = d.copy(), len(out), (bounds.bytes, bounds.lines, bounds.run)
            try:
                if not keep(d.decompress(chunk, _CHUNK << 4)):
                    return b"".join(out), bounds.over
                while d.unconsumed_tail:  # a chunk that inflates to more than 1 MiB: in bounded steps
                    if not keep(d.decompress(d.unconsumed_tail, _CHUNK << 4)):
                        return b"".join(out), bounds.over
            except zlib.error:  # again from before this chunk, a byte at a time, to keep all that precedes the fault
                d, (bounds.bytes, bounds.lines, bounds.run) = before, counts
                del out[mark:]
                for i in range(len(chunk)):
                    try:
                        if not keep(d.decompress(chunk[i:i + 1])):
                            return b"".join(out), bounds.over
                    except zlib.error as exc:
                        return b"".join(out), _lost(pos + i, len(data), str(exc))
            pos += len(chunk) - len(d.unused_data)
        if not d.eof:  # the writer never finished this member: keep what was flushed
            return b"".join(out), "no gzip end (the writer was stopped, or the file cut): read what was flushed"
        if pos < len(data) and not data.startswith(_GZIP_MAGIC, pos):
            return b"".join(out), _lost(pos, len(data), "not gzip data")
    return b"".join(out), None


def _lost(at: int, size: int, why: str) -> str:
    why = why.removeprefix("Error -3 while decompressing data: ")
    return f"corrupt gzip ({why}): read {at:,} of {size:,} bytes"


def read_recording(path: str | Path) -> Recording:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordingError(f"cannot read recording {str(path)!r}: {exc.strerror or exc}") from None
    damage = None
    if data.startswith(_GZIP_MAGIC):
        data, damage = _decompress_tolerant(data)
    else:
        bounds = _Bounds()
        data, damage = bounds.take(data), bounds.over
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines.pop()
    header = _parse_header(path, lines[0] if lines else "")
    rec = Recording(path=path, header=header, damage=damage)
    last_t = 0.0
    n = len(lines)
    for i in range(1, n):
        line = lines[i]
        if not line.strip():
            continue
        parsed = _parse_line(line)
        if parsed is None:
            if i == n - 1 and not ends_with_newline:
                rec.truncated = True
            else:
                rec.skipped += 1
            continue
        t, type_, version = parsed
        if t > last_t + MAX_GAP_S:  # `t: 1e300` would hold every later event back for ever
            rec.skipped += 1
            continue
        if version.__class__ is int and version != PROTOCOL_VERSION:  # a newer server's: its consumer refuses it
            rec.other_versions[version] = rec.other_versions.get(version, 0) + 1
        last_t = max(last_t, t)
        rec.times.append(last_t)
        rec.types.append(type_)
        rec.lines.append(line)
    return rec


def _parse_header(path: Path, line: str) -> dict[str, Any]:
    not_rec = f"{str(path)!r} is not a pdtop recording"
    try:
        header = json.loads(line)
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


def _parse_line(line: str) -> tuple[float, str, Any] | None:
    """A line's time, event type and protocol version, or None if it is not a recorded event."""
    try:
        obj = json.loads(line)
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
