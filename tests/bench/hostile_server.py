"""A real HTTP server on loopback that answers an OpenAI client as a hostile (or broken) server may: what
`bench --url` must survive with its memory and time bounded. It is the server, not the thing under test.

Modes (`mode`), each on `POST /v1/completions` unless said:
- `endless`: token events without end (up to `limit` bytes, then the connection closes, no `[DONE]`);
- `pings`: SSE comments without end, and no token (the same);
- `long_line`: one `data: ` line that never ends (`limit` bytes);
- `silent`: one token, then nothing, the connection held open until the server closes;
- `models`: `GET /v1/models` is a valid listing padded to `limit` bytes;
- `escape`: HTTP 500 whose body clears the screen, sets the window title and rings the bell;
- `deep`: one event of 100,000 nested lists;
- `gzip`: `Content-Encoding: gzip`, one line that inflates to `limit` bytes.
`sent` counts the body bytes written.
"""
from __future__ import annotations

import json
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = b'data: {"choices": [{"index": 0, "text": " x", "finish_reason": null}]}\n\n'
MODEL = {"id": "hostile", "object": "model", "root": "hostile"}


class HostileServer:
    def __init__(self, mode: str, limit: int = 256 << 20) -> None:
        self.mode, self.limit, self.sent = mode, limit, 0
        self.closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _head(self, status: int, kind: str, length: int | None = None, **extra: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                if length is not None:
                    self.send_header("Content-Length", str(length))
                for name, value in extra.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()

            def _write(self, data: bytes) -> None:
                self.wfile.write(data)
                server.sent += len(data)

            def do_GET(self) -> None:
                listing = json.dumps({"object": "list", "data": [MODEL]}).encode()
                if server.mode != "models":
                    self._head(200, "application/json", len(listing))
                    self._write(listing)
                    return
                pad = server.limit - len(listing) - 12
                self._head(200, "application/json", len(listing) + 12 + pad)
                try:
                    self._write(listing[:-1] + b', "pad": "')
                    for _ in range(pad // 65536):
                        self._write(b"x" * 65536)
                    self._write(b"x" * (pad % 65536) + b'"}')
                except (BrokenPipeError, ConnectionResetError):
                    return

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    getattr(self, f"_{server.mode}", self._ok)()
                except (BrokenPipeError, ConnectionResetError):
                    return

            def _ok(self) -> None:
                body = TOKEN + b"data: [DONE]\n\n"
                self._head(200, "text/event-stream", len(body))
                self._write(body)

            def _endless(self) -> None:
                self._head(200, "text/event-stream")
                block = TOKEN * 1024
                while server.sent < server.limit:
                    self._write(block)

            def _pings(self) -> None:
                self._head(200, "text/event-stream")
                block = b": ping\n\n" * 8192
                while server.sent < server.limit:
                    self._write(block)

            def _long_line(self) -> None:
                self._head(200, "text/event-stream")
                self._write(b'data: {"choices": [{"text": "')
                while server.sent < server.limit:
                    self._write(b"x" * 65536)

            def _silent(self) -> None:
                self._head(200, "text/event-stream")
                self._write(TOKEN)
                self.wfile.flush()
                server.closing.wait()

            def _escape(self) -> None:
                body = b"\x1b[2J\x1b]0;pwned\x07 the server says no\n"
                self._head(500, "text/plain", len(body))
                self._write(body)

            def _deep(self) -> None:
                body = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"
                self._head(200, "text/event-stream", len(body))
                self._write(body)

            def _gzip(self) -> None:
                packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
                block, body = b"x" * 65536, [packer.compress(b'data: {"choices": [{"text": "')]
                body += [packer.compress(block) for _ in range(server.limit // len(block))]
                data = b"".join(body) + packer.flush()
                self._head(200, "text/event-stream", len(data), Content_Encoding="gzip")
                self._write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
