"""Clients that hold connections, send endless headers or trailers, never send their body (slowloris), or
guess the token, on real uvicorn with raw sockets."""
from __future__ import annotations

import json
import logging
import socket
import time
import tracemalloc

import httpx
import pytest

from pdtop.api.connections import ConnectionLimits
from pdtop.engine.build import build_engine

from .live_api import LiveApi

LIMITS = ConnectionLimits(header_timeout=0.5, body_timeout=0.5, per_client=8, max_requests=16)
TOKEN = {"authorization": "Bearer s3cret"}


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


BODYLESS = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")  # and never the 100 bytes


def test_a_body_that_never_comes_is_408_at_its_deadline(guarded):
    s = _connect(guarded, "127.0.2.2")
    s.sendall(BODYLESS)
    status, err = _status_and_error(_read_all(s))
    assert status == 408 and err["code"] == "request_timeout" and "body" in err["message"]
    s.close()


def test_bodyless_posts_from_several_addresses_do_not_refuse_other_requests(guarded):
    """Issue 38 item 4 at the fixture's scale: 5 addresses x per_client body-less POSTs are more than
    max_requests, yet they are requests still arriving, not requests being answered."""
    held = [_connect(guarded, f"127.0.3.{2 + i % 5}") for i in range(5 * LIMITS.per_client)]
    for s in held:
        s.sendall(BODYLESS)
    tasks = guarded.api._server.server_state.tasks
    guarded.wait(lambda: len(tasks) >= LIMITS.max_requests)  # as many started as may be answered at once
    assert httpx.get(guarded.url + "/models", timeout=10).status_code == 200
    guarded.wait(lambda: len(tasks) >= len(held))  # and then every one of them
    assert httpx.get(guarded.url + "/models", timeout=10).status_code == 200
    for s in held:  # then each is closed at its body deadline
        status, err = _status_and_error(_read_all(s))
        assert status == 408 and err["code"] == "request_timeout"
        s.close()


def test_five_times_1024_bodyless_posts_leave_v1_models_answering(tokenizer):
    """Issue 38 item 4 at its own scale, with the default limits: 5 x 1,024 POSTs with `Content-Length: 100`
    and no body, from 127.0.0.2..6, made every /v1/models call answer 503."""
    live = LiveApi(build_engine("sim:H100"), tokenizer, run_engine=False)
    held: list[socket.socket] = []
    try:
        for i in range(5 * 1024):
            s = _connect(live, f"127.0.4.{2 + i % 5}")
            s.sendall(BODYLESS)
            held.append(s)
        tasks = live.api._server.server_state.tasks
        live.wait(lambda: len(tasks) >= ConnectionLimits().max_requests)
        assert httpx.get(live.url + "/models", timeout=10).status_code == 200
        live.wait(lambda: len(tasks) >= len(held))
        for _ in range(3):
            assert httpx.get(live.url + "/models", timeout=10).status_code == 200
    finally:
        for s in held:
            s.close()
        live.close()


def _trailer_flood(live: LiveApi, headers: bytes = b"", fields: int = 20) -> tuple[bytes, int]:
    """POST a chunked body with `fields` trailer fields of 1 MiB: what came back, and the peak of the memory
    Python allocated meanwhile (the server runs in this process)."""
    s = _connect(live)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + headers
              + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n")
    value = b"a" * ((1 << 20) - 32)
    tracemalloc.start()
    try:
        for i in range(fields):
            s.sendall(b"X-Trailer-%d: " % i + value + b"\r\n")
        s.sendall(b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the end
    answer = _read_all(s)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    s.close()
    return answer, peak


# The server holds at most 16 KiB of trailers and one 4 KiB slice past them, plus its 256 KiB read buffer;
# 4 MiB leaves room for what the interpreter allocates meanwhile (the test's own 1 MiB lines included). 20 MiB
# of trailer fields were held whole before, in the request's headers (6 x 20 MiB: 223 MB -> 3.8 GB).
FLOOD_PEAK = 4 << 20


def test_chunked_trailers_past_16_kib_are_431_and_never_held(guarded, caplog):
    caplog.set_level(logging.WARNING)
    answer, peak = _trailer_flood(guarded)
    assert peak < FLOOD_PEAK
    assert answer == b"" or _status_and_error(answer)[0] == 431  # or reset before it was read
    assert any("trailers over 16384 bytes" in r.getMessage() for r in caplog.records)
    assert _health(guarded) == 200


def test_trailers_are_dropped_not_added_to_the_headers(guarded):
    """A trailer is not a header: an `Authorization` trailer must not reach the app (it would pass the
    token check of a server that read headers late)."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "stream": True}).encode()
    s = _connect(guarded)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) + body
              + b"\r\n0\r\nContent-Type: text/plain\r\nX-Smuggled: 1\r\n\r\n")
    assert s.recv(12) == b"HTTP/1.1 200"  # its Content-Type stayed application/json
    s.close()


@pytest.fixture
def tokened(tokenizer):
    """A simulated GPU whose engine never runs, behind a token: a fresh one per test (wrong tokens count)."""
    server = LiveApi(build_engine("sim:H100"), tokenizer, run_engine=False, token="s3cret", limits=LIMITS)
    yield server
    server.close()


def test_a_request_without_the_token_is_refused_before_its_body_is_read(tokened):
    """With --token, a request without one had its trailers parsed all the same (104 -> 1,049 MB)."""
    s = _connect(tokened)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n")
    status, err = _status_and_error(_read_all(s))  # at once, and closed: the body is not waited for
    assert status == 401 and err["code"] == "invalid_api_key"
    s.close()
    answer, peak = _trailer_flood(tokened)
    assert peak < FLOOD_PEAK
    assert answer == b"" or answer.startswith(b"HTTP/1.1 401")
    assert httpx.get(tokened.url + "/models", headers=TOKEN, timeout=10).status_code == 200


def test_wrong_tokens_make_the_address_wait_across_connections(tokened):
    """Guesses went at 1,707/s on one kept-alive connection. After a few wrong tokens an address waits, and
    meanwhile no token it gives is checked: not on a new connection, not from another loopback address."""
    with httpx.Client(timeout=10) as client:
        answers = [client.get(tokened.url + "/models", headers={"authorization": f"Bearer guess{i}"})
                   for i in range(12)]
    assert [r.status_code for r in answers] == [401] * 5 + [429] * 7
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "too_many_wrong_tokens"
               for r in answers[5:])
    s = _connect(tokened, "127.0.5.9")  # the same machine: the same budget
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\n\r\n")
    status, err = _status_and_error(_read_all(s))
    assert status == 429 and "not checked" in err["message"]
    s.close()
    assert httpx.get(tokened.root + "/health", timeout=10).status_code == 200  # no token needed there
    time.sleep(1.05)
    assert httpx.get(tokened.url + "/models", headers=TOKEN, timeout=10).status_code == 200
    wrong = httpx.get(tokened.url + "/models", headers={"authorization": "Bearer again"}, timeout=10)
    assert wrong.status_code == 401  # the right token cleared the record


def test_a_request_whose_body_is_late_does_not_wait_for_it_once_answered(guarded):
    """A 404 is answered without reading the body; the body deadline then only closes the connection."""
    s = _connect(guarded, "127.0.6.2")
    s.sendall(b"POST /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 404") and answer.count(b"HTTP/1.1") == 1
    s.close()
