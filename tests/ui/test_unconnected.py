"""Issue 25 item 15: a dashboard not connected yet says that nothing is known (not "all 0 units" or
"KV – 0/0"), and a bare host:port is refused naming both URL kinds attach takes. Issue 42 item 15: a bad
ws:// URL is refused up front in one line, and a server of the wrong kind is named for what it is."""
from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp


def _shown(app, panel: str) -> str:
    app.repaint()
    return "\n".join(t.plain for t in app.query_one(panel)._last_texts)


async def test_nothing_known_before_the_first_message():
    app = PdtopApp(LiveSource("ws://127.0.0.1:9"), interval_s=0.05)  # nothing listens there
    for size in ((80, 24), (160, 48)):
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.3)
            split, requests = _shown(app, "SplitPanel"), _shown(app, "RequestsPanel")
            assert "nothing known yet" in split and "0 units" not in split and "one step" not in split
            assert "0/0" not in requests and "KV" in requests and "nothing known yet" in requests
            for name in ("SplitPanel", "RequestsPanel"):  # nothing cut at 80x24
                panel = app.query_one(name)
                assert all(t.cell_len <= panel.content_size.width for t in panel._last_texts), _shown(app, name)
        app = PdtopApp(LiveSource("ws://127.0.0.1:9"), interval_s=0.05)


def test_a_bare_host_port_names_ws_and_http():
    done = subprocess.run([sys.executable, "-m", "pdtop", "attach", "127.0.0.1:8765"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "ws://HOST:PORT" in done.stderr and "http://HOST:PORT" in done.stderr


@pytest.mark.parametrize("command", [["attach"], ["record", "-o", "never.ndjson"]])
@pytest.mark.parametrize("url, said", [("ws://", "ws://HOST:PORT"), ("ws://:8765", "ws://HOST:PORT"),
                                       ("ws://127.0.0.1:99999", "1 to 65535"), ("ws://127.0.0.1:port", "1 to 65535"),
                                       ("wss://127.0.0.1:0", "1 to 65535")])
def test_a_bad_ws_url_is_one_line_and_exit_2_before_anything_starts(command, url, said, tmp_path):
    """Issue 42 item 15: `attach ws://` printed a raw `InvalidURI ... ws://?batch=1` (a query of its own
    leaking), or `ValueError: Port out of range`, and exited 1. Checked up front, as http:// URLs are."""
    done = subprocess.run([sys.executable, "-m", "pdtop", command[0], url, *command[1:]], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"pdtop {command[0]}: error: ") and said in lines[0] and repr(url) in lines[0]
    assert "batch" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "never.ndjson").exists()


class PlainPage(BaseHTTPRequestHandler):
    """Python's own HTTP/1.0 server answering every GET with a page."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello\n")

    def log_message(self, *args: object) -> None:
        pass


async def test_a_ws_url_at_a_plain_http_server_says_what_answered(until):
    """Issue 42 item 15: `InvalidMessage: did not receive a valid HTTP response` from a plain HTTP server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), PlainPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        app = PdtopApp(LiveSource(f"ws://127.0.0.1:{server.server_port}"), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.source_error is not None, "the source's failure")
            assert "did not answer as a websocket" in app.source_error and "http://HOST:PORT" in app.source_error
            assert "Invalid" not in app.source_error, app.source_error
    finally:
        server.shutdown()
        server.server_close()


def test_http_at_the_websocket_port_hints_at_ws(served, tmp_path):
    """Issue 42 item 15: `http://` to pdtop serve's websocket port said only "426 Upgrade Required"."""
    url = served.url.replace("ws://", "http://")
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", url, "-o", str(tmp_path / "r.ndjson"),
                           "--duration", "1.5"], capture_output=True, text=True, timeout=60)
    said = [line for line in done.stderr.splitlines() if "426" in line]
    assert said and f"attach ws://{url.split('//')[1]}" in said[0], done.stderr
