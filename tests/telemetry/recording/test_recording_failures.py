"""A recording that cannot be written (a full disk, a file size limit) is one clean
`RecordingError`: the server stops recording, tells every client with an `error` event
and keeps streaming; `serve --record` and `pdtop record` say so in one line."""
from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys

import pytest
from websockets.asyncio.client import connect

PDTOP = [sys.executable, "-m", "pdtop"]


def file_size_limit(n: int):
    """For preexec_fn: writes past `n` bytes fail with EFBIG (Python ignores SIGXFSZ), as on a full disk."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


@pytest.fixture
def serve_with_limit(tmp_path):
    started: list[subprocess.Popen] = []

    def start(limit: int, *args: str) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([*PDTOP, "serve", "--device", "sim:H100", "--port", "0", "--rate", "20",
                                 "--record-dir", str(tmp_path), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                preexec_fn=file_size_limit(limit))
        started.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("pdtop serve: listening on"), proc.stderr.read()
        return proc, line.split()[-1]

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        p.stdout.close()
        p.stderr.close()


async def _events(ws, until, timeout: float = 20.0) -> list[dict]:
    got: list[dict] = []

    async def read():
        while not until(got):
            event = json.loads(await ws.recv())
            got.extend(event["events"] if event["type"] == "batch" else [event])

    await asyncio.wait_for(read(), timeout)
    return got


async def _request(ws, msg: dict) -> dict:
    await ws.send(json.dumps(msg))
    events = await _events(ws, lambda got: any(e["type"] == "reply" for e in got))
    return next(e for e in events if e["type"] == "reply")


async def test_a_recording_that_fills_the_disk_stops_and_the_stream_goes_on(serve_with_limit, tmp_path):
    serve, url = serve_with_limit(64 * 1024)
    async with connect(url) as ws:
        reply = await _request(ws, {"cmd": "record_start", "path": "full.ndjson"})
        assert reply["ok"], reply
        events = await _events(ws, lambda got: any(e["type"] == "error" for e in got))
        (error,) = [e for e in events if e["type"] == "error"]
        assert error["field"] == "path" and "stopped" in error["reason"] and "File too large" in error["reason"]
        after = await _events(ws, lambda got: sum(e["type"] == "round" for e in got) >= 50)  # the stream goes on
        assert not [e for e in after if e["type"] == "error"]
        again = await _request(ws, {"cmd": "record_stop"})
        assert again["ok"] is False and again["error"]["reason"] == "not recording"
    assert (tmp_path / "full.ndjson").stat().st_size <= 64 * 1024
    serve.terminate()
    assert serve.wait(20) == 0
    err = serve.stderr.read()
    assert "Traceback" not in err and "recording stopped: cannot write recording" in err, err


async def test_record_start_that_cannot_write_its_header_is_refused_with_the_reason(serve_with_limit):
    _, url = serve_with_limit(200)  # less than a header
    async with connect(url) as ws:
        reply = await _request(ws, {"cmd": "record_start", "path": "r.ndjson"})
        assert reply["ok"] is False and reply["error"]["field"] == "path"
        assert reply["error"]["reason"].startswith("cannot write recording") and "File too large" in \
            reply["error"]["reason"]
        assert (await _request(ws, {"cmd": "auto_level"}))["ok"] is True  # the server goes on


def test_serve_record_to_a_full_disk_is_one_line():
    done = subprocess.run([*PDTOP, "serve", "--device", "sim:H100", "--port", "0", "--record", "/dev/full"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pdtop serve: error: cannot write recording '/dev/full': No space left on device"]


def test_record_command_to_a_full_disk_exits_1_in_one_line_without_the_token(serve_with_limit):
    _, url = serve_with_limit(1 << 30)
    done = subprocess.run([*PDTOP, "record", f"{url}/?token=S3CRET-VALUE", "-o", "/dev/full", "--duration", "5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "S3CRET" not in done.stderr + done.stdout
    assert lines == [f"pdtop record: connecting to {url}/?token=***",
                     "pdtop record: error: cannot write recording '/dev/full': No space left on device"]
