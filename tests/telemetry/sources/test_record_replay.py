"""`pdtop record http://...` writes the scrapes of a vLLM server as events, and they replay like any recording."""
from __future__ import annotations

import asyncio
import subprocess
import sys

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Hello, Metrics, Seek
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.sources.replay import ReplaySource

from ..servers import LLAMA


def test_record_scrapes_a_vllm_server_and_replay_plays_them(vllm, tmp_path):
    vllm.m(vllm.running).set(6)
    vllm.m(vllm.kv).set(0.5)
    path = tmp_path / "vllm.ndjson.gz"
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", vllm.server.url, "-o", str(path), "--interval",
                           "0.1", "--duration", "1.5", "--token", "s3cret"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "s3cret" not in done.stdout + done.stderr
    assert all(headers["Authorization"] == "Bearer s3cret" for _, headers in vllm.server.requests)

    recording = read_recording(path)
    hello = decode_event(recording.hello)
    assert isinstance(hello, Hello) and hello.engine is None and hello.scrape.model_name == LLAMA
    scrapes = [decode_event(event) for _, event in recording if event["type"] == "metrics"]
    assert len(scrapes) >= 5 and all(isinstance(m, Metrics) and m.running == 6 and m.kv_usage == 0.5 for m in scrapes)
    assert f"{len(recording)} events in" in done.stderr

    async def play() -> list[dict]:
        src = ReplaySource(path, speed=16.0, hold_at_end=False)
        seen = []
        async for event in src.events():
            seen.append(event)
            if len(seen) == 3:
                src.seek(0.5)  # a recording without an engine configuration seeks too
        return seen

    played = asyncio.run(play())
    assert played[0] == recording.hello
    seek = decode_event(next(e for e in played if e["type"] == "seek"))
    assert isinstance(seek, Seek) and seek.config is None
    assert sum(e["type"] == "metrics" for e in played) >= len(scrapes) // 2


def test_record_says_why_it_waits_for_a_server_that_is_not_there(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", "http://127.0.0.1:9", "-o",
                           str(tmp_path / "r.ndjson"), "--duration", "1.2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1  # nothing recorded is a failure, said in one line (issue 42 item 19)
    assert "pdtop record: http://127.0.0.1:9/metrics: connection refused (nothing listens there); retrying" \
        in done.stderr
    assert done.stderr.splitlines()[-1].startswith("pdtop record: error: nothing recorded: ")
    assert not (tmp_path / "r.ndjson").exists()  # nothing to record before the first scrape
