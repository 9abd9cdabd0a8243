"""Clients that hold connections or send endless headers (slowloris), on real uvicorn with raw sockets."""
from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest

from pdtop.api.connections import ConnectionLimits
from pdtop.engine.build import build_engine

from .live_api import LiveApi

LIMITS = ConnectionLimits(header_timeout=0.5, per_client=8, max_requests=16)


@pytest.fixture(scope="module")
def guarded(tokenizer):
    """A simulated GPU whose engine never runs (requests wait), behind small connection limits."""
    server = LiveApi(build_engine("sim:H100"), tokenizer, run_engine=False, limits=LIMITS)
    yield server
    server.close()


def _connect(live: LiveApi, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))  # every 127.x address is loopback: one "client" per source address
    s.settimeout(10)
    s.connect(("127.0.0.1", live.api.port))
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def _health(live: LiveApi) -> int:
    return httpx.get(live.root + "/health", timeout=10).status_code


def _status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_idle_and_slow_header_sockets_neither_block_requests_nor_stay_open(guarded):
    idle = [_connect(guarded, f"127.0.0.{2 + i % 2}") for i in range(12)]
    slow = [_connect(guarded, f"127.0.1.{2 + i % 2}") for i in range(12)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends its headers
    assert _health(guarded) == 200  # 24 held sockets, max_requests 16: they are not requests
    for s in idle + slow:  # closed by the server at the header deadline, with an OpenAI error
        status, err = _status_and_error(_read_all(s))
        assert status == 408 and err["code"] == "request_timeout"
        s.close()
    assert _health(guarded) == 200


def test_a_client_at_its_cap_loses_its_oldest_waiting_connection_not_the_new_request(guarded):
    held = [_connect(guarded, "127.0.0.4") for _ in range(LIMITS.per_client)]
    time.sleep(0.05)
    s = _connect(guarded, "127.0.0.4")
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert _read_all(s).startswith(b"HTTP/1.1 200")
    assert _read_all(held[0]) == b""  # the oldest, closed without a word
    for c in [*held, s]:
        c.close()


def test_a_client_whose_connections_are_all_busy_gets_a_503_error_object(guarded):
    body = json.dumps({"prompt": "hi", "max_tokens": 2, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    busy = []
    for _ in range(LIMITS.per_client):
        c = _connect(guarded, "127.0.0.5")
        c.sendall(request)  # waits in the queue: the engine never runs
        assert c.recv(12) == b"HTTP/1.1 200"
        busy.append(c)
    status, err = _status_and_error(_read_all(_connect(guarded, "127.0.0.5")))
    assert status == 503 and err["code"] == "too_many_connections"
    assert _health(guarded) == 200  # another address is served
    for c in busy:
        c.close()


@pytest.mark.parametrize("size", [20 << 10, 1 << 20])
def test_headers_past_16_kib_are_431_before_they_are_buffered(guarded, size):
    s = _connect(guarded)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    try:
        s.sendall(b"a" * size)  # unfinished: the server answers before the end
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, err = _status_and_error(_read_all(s))
    assert status == 431 and err["code"] == "headers_too_large"
    s.close()
    r = httpx.get(guarded.root + "/health", headers={"x-fits": "a" * (15 << 10)}, timeout=10)
    assert r.status_code == 200


def test_sockets_have_tcp_nodelay(guarded):
    with httpx.Client(timeout=10) as client:  # one kept-alive connection
        assert client.get(guarded.root + "/health").status_code == 200
        sockets = [p.transport.get_extra_info("socket") for p in guarded.api._server.server_state.connections]
        assert sockets and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_malformed_http_is_a_400_error_object_and_logged_once(guarded, caplog):
    caplog.set_level(logging.WARNING)
    for _ in range(20):
        s = _connect(guarded, "127.0.0.6")
        s.sendall(b"GARBAGE\x00 / HTTP/9.9\r\n\r\n")
        status, err = _status_and_error(_read_all(s))
        assert status == 400 and err["code"] == "bad_http_request"
        s.close()
    lines = [r for r in caplog.records if "malformed" in r.getMessage() or "Invalid HTTP" in r.getMessage()]
    assert len(lines) == 1


def test_a_websocket_upgrade_is_not_served_on_the_api_port(guarded):
    s = _connect(guarded)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
              b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    s.settimeout(5)
    assert not s.recv(65536).startswith(b"HTTP/1.1 101")
    s.close()
    assert _health(guarded) == 200


def test_a_kept_alive_connection_gets_a_header_deadline_for_its_next_request_too(guarded):
    s = _connect(guarded)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0")  # the next request, never finished
    status, err = _status_and_error(_read_all(s))
    assert status == 408 and err["code"] == "request_timeout"
    s.close()
