"""Issue 27 §2 items 10 and 11 and issue 38 item 11: recordings built to exhaust the reader, and files cut or
bent."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib

from pdtop.telemetry.recording import reader
from pdtop.telemetry.recording.reader import MAX_LINE_BYTES, MAX_LINES, read_recording
from pdtop.telemetry.recording.recorder import Recorder

from ..conftest import hello_event

HELLO = hello_event()
HEADER = json.dumps({"format": "pdtop-recording", "format_version": 1, "hello": HELLO}).encode() + b"\n"


def _bomb(path, filler: bytes, megabytes: int) -> None:
    """A gzip member of `megabytes` MiB of `filler`: a few hundred KB on disk."""
    d = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [d.compress(HEADER)]
    block = filler * ((1 << 20) // len(filler))
    parts += [d.compress(block) for _ in range(megabytes)]
    path.write_bytes(b"".join(parts) + d.flush())


def test_a_gzip_bomb_of_newlines_stops_at_the_line_bound(tmp_path):
    path = tmp_path / "bomb.ndjson.gz"
    _bomb(path, b"\n", 100)  # 100 million lines in about 100 KB
    assert path.stat().st_size < 200_000
    got = read_recording(path)
    assert len(got) == 0 and got.problems == [f"more than {MAX_LINES:,} lines: the rest is not read"]


def test_a_gzip_bomb_of_one_endless_line_stops_at_the_line_length_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 4 << 20)
    path = tmp_path / "line.ndjson.gz"
    _bomb(path, b"a", 64)
    got = read_recording(path)
    assert len(got) == 0 and "a line over 4 MiB: the rest is not read" in got.problems


def test_a_gzip_bomb_of_events_stops_at_the_size_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_BYTES", 8 << 20)
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(reader, "MAX_LINES", 10**9)
    event = json.dumps({"t": 0.0, "event": {"type": "round", "v": 1}}).encode() + b"\n"
    path = tmp_path / "events.ndjson.gz"
    _bomb(path, event, 32)
    got = read_recording(path)
    assert 0 < len(got) <= (8 << 20) // len(event)
    assert "more than 8 MiB of events: the rest is not read" in got.problems


def test_a_gzip_cut_at_two_thirds_says_so(tmp_path):
    path = tmp_path / "r.ndjson.gz"
    rec = Recorder(path, HELLO, clock=lambda: 0.0)
    for i in range(3000):
        rec.write(json.dumps({"type": "round", "v": 1, "index": i, "pad": "x" * (i % 97)}), t=i * 0.01)
        if i % 100 == 0:
            rec.flush()
    rec.close()
    data = path.read_bytes()
    cut = tmp_path / "cut.ndjson.gz"
    cut.write_bytes(data[:len(data) * 2 // 3])
    got = read_recording(cut)
    assert 0 < len(got) < 3000
    assert any(p.startswith("no gzip end") for p in got.problems)
    assert read_recording(path).problems == []  # the whole file is clean
    assert gzip.decompress(data)  # and a valid gzip


def test_a_time_far_ahead_is_skipped_not_waited_for(tmp_path):
    path = tmp_path / "r.ndjson"
    lines = [HEADER] + [json.dumps({"t": t, "event": {"type": "round", "v": 1, "i": i}}).encode() + b"\n"
                        for i, t in enumerate([0.0, 0.5, 1e300, 1.0, 1.5])]
    path.write_bytes(b"".join(lines))
    got = read_recording(path)
    assert [e["i"] for _, e in got] == [0, 1, 3, 4] and got.duration == 1.5
    assert got.problems == ["1 unreadable line skipped"]


def _read_in_a_process(path) -> tuple[int, list[str], int]:
    """`pdtop replay`'s reading of `path` in a fresh process: its events, problems and peak RSS in MB."""
    # VmHWM, not ru_maxrss: the kernel's ru_maxrss of a fresh process starts at its parent's peak (pytest's)
    code = ("import re, sys\nfrom pdtop.telemetry.recording.reader import read_recording\n"
            "r = read_recording(sys.argv[1])\n"
            "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
            "print(len(r), hwm // 1024)\nprint('\\n'.join(r.problems))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, *problems = done.stdout.splitlines()
    events, peak_mb = map(int, first.split())
    return events, problems, peak_mb


def test_a_small_gzip_of_huge_events_stops_at_the_event_bound(tmp_path):
    """64 events padded to 16 MiB each, 1 MB of gzip (issue 38 item 11: main held 3.1 GB at its peak). An
    event is at most 1 MiB (pdtop's largest, a 256-server fleet, is about 0.5 MB), so the reader stops at
    the first; the bound: the reading process stays under 200 MB (the interpreter and pdtop's imports are
    about 60 MB of it)."""
    path = tmp_path / "huge.ndjson.gz"
    head = b'{"t":0,"event":{"type":"round","v":1,"pad":"'
    member = gzip.compress(head + b"x" * ((16 << 20) - len(head) - 4) + b'"}}\n', 9)  # one event, ~16 KB
    path.write_bytes(gzip.compress(HEADER) + member * 64)  # gzip members in sequence, as appending writes them
    assert path.stat().st_size < 1_100_000
    events, problems, peak_mb = _read_in_a_process(path)
    assert events == 0 and problems == [f"a line over {MAX_LINE_BYTES >> 20} MiB: the rest is not read"]
    assert peak_mb < 200, f"{peak_mb} MB"


def test_four_million_small_events_stop_at_the_line_bound(tmp_path):
    """4 million small events in a few hundred KB of gzip (issue 38 item 11: 43 s and 3.5 GB on main). At most
    a million lines are read (about two hours of a busy sim: server, which writes 140 events a second), each
    held as its bytes and ~60 bytes of bookkeeping; the bound: under 300 MB for the reading process
    (measured about 100 MB)."""
    path = tmp_path / "many.ndjson.gz"
    event = b'{"t":0,"event":{"type":"x","v":1}}\n'
    d = zlib.compressobj(9, zlib.DEFLATED, 31)
    path.write_bytes(d.compress(HEADER) + b"".join(d.compress(event * 100_000) for _ in range(40)) + d.flush())
    events, problems, peak_mb = _read_in_a_process(path)
    assert events == MAX_LINES - 1 and problems == [f"more than {MAX_LINES:,} lines: the rest is not read"]
    assert peak_mb < 300, f"{peak_mb} MB"
