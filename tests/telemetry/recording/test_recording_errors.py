"""Issue 27 §2 item 11: a recording refused on a full disk leaves no file; errors never say where the
recordings directory is."""
from __future__ import annotations

import subprocess
import sys

from pdtop.telemetry.server.server import TelemetryServer

from ..conftest import Raw

# RLIMIT_FSIZE 0 makes every write to a regular file fail with EFBIG, as a full disk fails with ENOSPC
FULL_DISK = r"""
import resource, signal, sys
from pdtop.engine.build import build_engine
from pdtop.telemetry.recording.recorder import RecordingError
from pdtop.telemetry.server.server import TelemetryServer

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
server = TelemetryServer(build_engine("sim:H100"), port=0, record_dir=sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
try:
    server.start_recording("a.ndjson")
except RecordingError as exc:
    print("refused:", exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
server.start_recording("a.ndjson")  # the retry: no "already exists"
print("recording:", server.stop_recording())
"""


def test_a_recording_refused_on_a_full_disk_leaves_no_file_and_can_be_retried(tmp_path):
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    refused, recording = out.stdout.splitlines()
    assert refused == "refused: cannot write recording 'a.ndjson': File too large"
    assert recording == f"recording: {tmp_path / 'a.ndjson'}" and (tmp_path / "a.ndjson").stat().st_size > 0


async def test_path_errors_do_not_name_the_recordings_directory(engine, tmp_path):
    inside = tmp_path / "secret-place" / "recordings"
    inside.mkdir(parents=True)
    (inside / "old.ndjson").write_text("x")
    async with TelemetryServer(engine, port=0, tick=0.01, record_dir=inside) as server:
        client = await Raw.open(server.url)
        await client.wait(lambda c: c.events)
        for path in ("../x.ndjson", "/etc/x.ndjson", "old.ndjson", "nodir/x.ndjson"):
            reply = await client.request({"cmd": "record_start", "path": path})
            assert reply["ok"] is False and "secret-place" not in reply["error"]["reason"], reply
        await client.close()
