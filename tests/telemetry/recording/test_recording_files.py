"""Recorder and reader on real files: header, events, gzip, truncation, bad input."""
from __future__ import annotations

import gzip
import json
import random

import pytest

from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.recording.recorder import Recorder, RecordingError

from ..conftest import hello_event

HELLO = hello_event()


def _event(i: int) -> dict:
    return {"type": "round", "v": 1, "index": i, "time": i * 0.01}


@pytest.mark.parametrize("name", ["rec.ndjson", "rec.ndjson.gz"])
def test_round_trip(tmp_path, name):
    path = tmp_path / name
    rec = Recorder(path, HELLO)
    for i in range(50):
        rec.write(json.dumps(_event(i)), t=i * 0.1)
    rec.close()
    got = read_recording(path)
    assert got.header["format"] == "pdtop-recording" and got.header["format_version"] == 1
    assert got.hello == HELLO
    assert [e["index"] for _, e in got] == list(range(50))
    assert got.times[-1] == pytest.approx(4.9) and got.duration == pytest.approx(4.9)
    assert got.skipped == 0 and not got.truncated
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_gzip_without_trailer_is_readable_up_to_last_flush(tmp_path):
    """What SIGKILL leaves: flushed data and no gzip end."""
    path = tmp_path / "killed.ndjson.gz"
    rec = Recorder(path, HELLO)
    for i in range(10):
        rec.write(json.dumps(_event(i)), t=i)
    rec.flush()
    rec.write(json.dumps(_event(10)), t=10)  # never flushed: may be lost
    data = path.read_bytes()  # the file as a killed process leaves it (no close)
    killed = tmp_path / "copy.ndjson.gz"
    killed.write_bytes(data)
    with pytest.raises(EOFError):
        gzip.decompress(data)  # the standard reader rejects it ...
    got = read_recording(killed)  # ... ours does not
    assert [e["index"] for _, e in got][:10] == list(range(10))
    rec.close()


def test_truncated_last_line_and_garbage_lines(tmp_path):
    path = tmp_path / "r.ndjson"
    rec = Recorder(path, HELLO)
    rec.write(json.dumps(_event(0)), t=0.0)
    rec.close()
    with open(path, "a") as f:
        f.write("not json\n")
        f.write('{"t": "soon", "event": {"type": "round"}}\n')  # t not a number
        f.write('{"t": 1, "event": {"no_type": 1}}\n')
        f.write('[1, 2]\n')
        f.write(json.dumps({"t": 2.0, "event": _event(1)}) + "\n")
        f.write('{"t": 3.0, "event": {"type": "ro')  # cut mid-line
    got = read_recording(path)
    assert [e["index"] for _, e in got] == [0, 1]
    assert got.skipped == 4
    assert got.truncated


def test_unknown_event_types_are_kept_for_the_consumer_to_ignore(tmp_path):
    path = tmp_path / "r.ndjson"
    rec = Recorder(path, HELLO)
    rec.write_event({"type": "from_the_future", "v": 1}, t=0.5)
    rec.close()
    assert read_recording(path).types == ["from_the_future"]


@pytest.mark.parametrize("content, words", [
    (b"", "not a pdtop recording"),
    (b"hello world\n", "not a pdtop recording"),
    (b'{"format": "asciicast"}\n', "not a pdtop recording"),
    (b'{"format": "pdtop-recording", "format_version": 99, "hello": {}}\n', "format version 99"),
    (b'{"format": "pdtop-recording", "format_version": 1}\n', "hello in its header cannot be read: .* not null"),
    (json.dumps({"format": "pdtop-recording", "format_version": 1, "hello": {**HELLO, "v": 2}}).encode() + b"\n",
     "hello in its header cannot be read: hello: protocol version 2"),
    (json.dumps({"format": "pdtop-recording", "format_version": 1,
                 "hello": {**HELLO, "engine": {**HELLO["engine"], "units": "132"}}}).encode() + b"\n",
     r"hello\.engine\.units: expected an integer, got '132'"),
    (b"\x1f\x8bgarbage", "not a pdtop recording"),
])
def test_not_a_recording(tmp_path, content, words):
    path = tmp_path / "bad.ndjson"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=words):
        read_recording(path)


def test_missing_file_and_unwritable_path(tmp_path):
    with pytest.raises(RecordingError, match="cannot read"):
        read_recording(tmp_path / "nope.ndjson")
    with pytest.raises(RecordingError, match="cannot write"):
        Recorder(tmp_path / "no" / "dir" / "r.ndjson", HELLO)



def test_a_corrupt_gzip_keeps_its_readable_prefix_and_says_what_was_lost(tmp_path):
    """One damaged spot in the middle: everything before it is kept (the reader used to keep nothing)."""
    path = tmp_path / "r.ndjson.gz"
    rng = random.Random(3)
    rec = Recorder(path, HELLO, clock=lambda: 0.0)
    for i in range(1083):
        rec.write(json.dumps({**_event(i), "round_s": rng.random(), "bytes_moved": rng.random() * 1e9}), t=i * 0.01)
        if i % 100 == 0:
            rec.flush()  # as the server does twice a second
    rec.close()
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    got = read_recording(path)
    indexes = [e["index"] for _, e in got]
    assert 400 <= len(indexes) < 1083 and indexes == list(range(len(indexes)))
    assert got.damage.startswith("corrupt gzip (") and got.damage.endswith(f"of {len(data):,} bytes")
    assert got.damage in got.problems
