"""`pdtop serve --api-port`: the api line, the URL in hello, API requests in the telemetry stream; the
dashboard's engine child serves the API and its state keeps the URL."""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

import httpx
from websockets.sync.client import connect

from pdtop.commands.dashboard import serve_command
from pdtop.telemetry.decode import decode_event
from pdtop.ui.state import DashboardState

PDTOP = [sys.executable, "-m", "pdtop"]


def test_serve_prints_the_api_line_announces_it_in_hello_and_streams_api_requests():
    proc = subprocess.Popen([*PDTOP, "serve", "--device", "sim:H100", "--port", "0", "--api-port", "0",
                             "--workload", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listening, api_line = proc.stdout.readline(), proc.stdout.readline()
        assert listening.startswith("pdtop serve: listening on ws://127.0.0.1:"), listening
        assert api_line.startswith("pdtop serve: api on http://127.0.0.1:") and api_line.strip().endswith("/v1")
        ws_url, api_url = listening.split()[-1], api_line.split()[-1]
        with connect(ws_url) as ws:
            first = json.loads(ws.recv(timeout=10))
            hello = decode_event(first)
            assert hello.api == api_url and hello.engine.limits.refused == {"workload": 0, "inject": 0, "api": 0}
            r = httpx.post(api_url + "/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            sources = set()
            while "finish" not in {k for k, _ in sources}:
                event = json.loads(ws.recv(timeout=10))
                if event["type"] == "request":
                    sources.add((event["kind"], event["source"]))
            assert sources == {("arrival", "api"), ("first_token", "api"), ("finish", "api")}
            state = DashboardState()
            state.ingest(first)
            assert state.api == api_url
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_api_flags_exit_2_with_one_line():
    for args in (["--api-port", "70000"], ["--workload", "none", "--rate", "3"], ["--max-waiting-requests", "0"]):
        out = subprocess.run([*PDTOP, "serve", "--device", "sim:H100", "--port", "0", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("pdtop serve: error:")


def test_the_dashboards_engine_child_serves_the_api():
    cmd = serve_command(argparse.Namespace(device="sim:H100", model=None, config=None, policy=None, rate=None,
                                           record=None))
    assert cmd[cmd.index("--api-port") + 1] == "0" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
