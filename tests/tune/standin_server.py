"""A stand-in OpenAI-compatible server for `pdtop tune --launch` tests (stdlib only, starts at once).

    python standin_server.py --config FILE --port N [--pid-file F] [--faults F] [--child] [--gap-ms X]
                             [--not-ws-port M]

It reads the pdmux YAML it is given: each streamed token takes `--gap-ms` times
`sm_group_num / 3` (so candidates differ), the first token a tenth of a millisecond per prompt
word more. `--pid-file` gets its pid (and its child's, with `--child`: a sleeping process in the
same group, as a real server's workers). `--faults` is a file of one mode a line; each start
takes the first line off it: `ok`, `crash-start` (exit 3 at once), `never-healthy` (/health
answers 503), `crash-mid` (exit 4 on the second completion request: the first is the warm-up).
`--not-ws-port` serves the same HTTP on a second port, where a websocket client (the `{control_port}`
of pdtop's protocol) gets 404: a control port that speaks something else.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def take_fault(path: str | None) -> str:
    if not path or not os.path.exists(path):
        return "ok"
    with open(path) as f:
        lines = f.read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[1:]))
    return lines[0].strip() if lines else "ok"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid-file")
    p.add_argument("--faults")
    p.add_argument("--child", action="store_true")
    p.add_argument("--gap-ms", type=float, default=2.0)
    p.add_argument("--not-ws-port", type=int)
    args = p.parse_args()
    fault = take_fault(args.faults)
    pids = [os.getpid()]
    if args.child:
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
    if args.pid_file:
        with open(args.pid_file, "a") as f:
            f.write("".join(f"{pid}\n" for pid in pids))
    print(f"standin: fault {fault}, config {args.config}", flush=True)
    if fault == "crash-start":
        print("boom: the stand-in cannot load its model", flush=True)
        sys.exit(3)
    config = {}
    with open(args.config) as f:
        for line in f:
            key, _, value = line.partition(":")
            if value.strip() and not key.startswith("#"):
                config[key.strip()] = value.strip()
    gap = args.gap_ms / 1e3 * int(config.get("sm_group_num", 8)) / 3
    completions = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _json(self, code: int, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(503 if fault == "never-healthy" else 200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
            else:
                self._json(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                completions[0] += 1
                n = completions[0]
            if fault == "crash-mid" and n >= 2:
                print("boom: crashed mid-run", flush=True)
                os._exit(4)
            words = len(body["prompt"].split())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(1e-4 * words)
            tokens = int(body["max_tokens"])
            for i in range(tokens):
                time.sleep(gap)
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            usage = {"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": tokens}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    ThreadingHTTPServer.daemon_threads = True
    if args.not_ws_port:
        other = ThreadingHTTPServer(("127.0.0.1", args.not_ws_port), Handler)
        threading.Thread(target=other.serve_forever, daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
