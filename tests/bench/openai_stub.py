"""A real HTTP server on loopback that speaks the streaming OpenAI completions API as a third-party server
would (as guidellm's mock server does), with a slow first request: what `bench --url` meets in the wild.
It is the server, not the thing under test."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubServer:
    """`GET /v1/models` lists "stub" (with vLLM's `root`: "org/stub-root"); `POST /v1/completions` streams
    `tokens` chunks `gap_s` apart after `ttft_s` (`first_ttft_s` for the very first request), then a usage
    chunk and `[DONE]`; `POST /v1/chat/completions` streams the same as chat deltas after a role-only
    opening chunk, as vLLM does. The first request's chunks say "cold", later ones "warm", so a result's
    texts show which requests were counted. `status` other than 200 answers every completion with that
    error. `started` / `finished` count completions; `requests` keeps each one's (path, headers, body)."""

    def __init__(self, *, first_ttft_s: float = 0.0, ttft_s: float = 0.0, gap_s: float = 0.0, tokens: int = 4,
                 status: int = 200) -> None:
        self.first_ttft_s, self.ttft_s, self.gap_s, self.tokens, self.status = (first_ttft_s, ttft_s, gap_s,
                                                                                 tokens, status)
        self.started = self.finished = 0
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    self._send(404, {"error": {"message": f"no {self.path}"}})
                    return
                model = {"id": "stub", "object": "model", "root": "org/stub-root"}
                self._send(200, {"object": "list", "data": [model]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat = self.path == "/v1/chat/completions"
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    self._send(404, {"error": {"message": f"no {self.path}"}})
                    return
                with server.lock:
                    first = server.started == 0
                    server.started += 1
                    server.requests.append((self.path, dict(self.headers), body))
                if server.status != 200:
                    self._send(server.status, {"error": {"message": "stub refuses", "type": "server_error"}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                word = "cold" if first else "warm"
                try:
                    time.sleep(server.first_ttft_s if first else server.ttft_s)
                    n = min(server.tokens, int(body.get("max_completion_tokens" if chat else "max_tokens",
                                                        server.tokens)))
                    if chat:
                        role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                        self.wfile.write(f"data: {json.dumps(role)}\n\n".encode())
                    for i in range(n):
                        if i:
                            time.sleep(server.gap_s)
                        choice = {"index": 0, "delta": {"content": f" {word}"}} if chat else {
                            "index": 0, "text": f" {word}", "finish_reason": None}
                        self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                        self.wfile.flush()
                    prompt = body["messages"][0]["content"][0]["text"] if chat else body["prompt"]
                    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n, "total_tokens": n}
                    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
                                     .encode())
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                with server.lock:
                    server.finished += 1

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
