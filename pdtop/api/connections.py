"""uvicorn's httptools protocol, guarded against clients that hold connections, send endless headers or
trailers, never send their body, or guess the token.

uvicorn alone times out only idle keep-alive connections, has no header size limit with
httptools, and its `limit_concurrency` counts connections, so a few thousand sockets that
connect and send nothing (slowloris) get every other client a 503. Here:
- the request line and headers must arrive within `header_timeout` seconds of the connection
  (or of the first byte of the next request on a kept-alive one), and the body within
  `body_timeout` of the headers, else 408 and closed; each connection's deadline is drawn
  between half of it and all of it, so that sockets opened together are not closed, and
  reopened, together (a burst of 600 stalled every request);
- the headers may take `max_header_bytes` (16 KiB, as h11), else 431 and closed, and so may a
  chunked body's trailers (which are then dropped, not added to the headers). The parser is fed
  `SLICE` bytes at a time and the sizes checked after each, so it never holds much more;
- with a token, a `/v1` request's `Authorization: Bearer TOKEN` is checked as soon as its headers
  are complete: a request without the right one is answered (401; 429 while its address must
  wait after wrong guesses, `TokenGate`) and its connection closed before a byte of its body
  is parsed;
- a client (an IP address) holds at most `per_client` connections: at the cap, its oldest
  connection still sending its request (headers or body) is closed to make room, and if none
  is the new one gets a 503;
- `max_requests` counts requests being answered, not connections, nor requests still sending
  their body: sockets that only connect, or send headers and no body, never refuse a request;
- every socket gets TCP_NODELAY (a reply must not wait for the client's delayed ACK);
- uvicorn's own 400 and 503 are OpenAI error objects, and what a flood repeats is logged
  once, then counted (`QuietLog`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from pdtop.quiet_log import QuietLog
from pdtop.token_gate import TokenGate

log = logging.getLogger("pdtop.api")
MAX_HEADER_BYTES = 16 << 10  # h11's default max_incomplete_event_size
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0  # 8 MB (the largest body) needs 560 KB/s at the shortest draw
PER_CLIENT = 1024  # connections one address may hold (500 concurrent streams from one load generator fit)
MAX_REQUESTS = 4096  # requests answered at once
SLICE = 4 << 10  # bytes fed to the parser at once: what it may take past a size limit before the check


@dataclass
class ConnectionLimits:
    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    per_client: int = PER_CLIENT
    max_requests: int = MAX_REQUESTS


@dataclass
class Guard:
    """What the connections of one server share: the limits, the token, and who holds how many connections."""

    limits: ConnectionLimits
    gate: TokenGate = field(default_factory=lambda: TokenGate(None))
    quiet: QuietLog = field(default_factory=lambda: QuietLog(log))
    held: dict[str, int] = field(default_factory=dict)  # address -> connections open
    # address -> its connections still sending a request (headers or body), oldest first
    waiting: dict[str, OrderedDict[GuardedProtocol, None]] = field(default_factory=dict)
    bodies: int = 0  # requests whose headers are in and body is not: not counted in max_requests
    refused: dict[str, int] = field(default_factory=dict)  # why -> connections or requests refused


def raw_error(status: int, message: str, code: str, type: str = "invalid_request_error",
              headers: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n", headers,
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class _Answered(Exception):
    """Raised from a parser callback that answered the request: the parser stops there."""


class GuardedProtocol(HttpToolsProtocol):
    guard: Guard  # set on the subclass `protocol_class` makes for one server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # ours counts requests, in on_headers_complete
        self._host = ""
        self._admitted = False
        self._answered = False  # a refusal was written: nothing more is parsed
        self._in_headers = True  # between requests, or reading a request's line and headers
        self._in_body = False  # headers in, body not yet (counted in `guard.bodies`)
        self._header_bytes = 0
        self._trailing = False  # a chunk's size line was parsed and no body since: the trailers may be coming
        self._trailer_bytes = 0
        self._deadline: asyncio.TimerHandle | None = None
        self.logger = _UvicornLog(self.guard.quiet)  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self._host = str(peer[0]) if peer else ""
        g = self.guard
        if g.held.get(self._host, 0) >= g.limits.per_client:
            waiting = g.waiting.get(self._host)
            if not waiting:
                self._count("per_client", f"this client holds {g.limits.per_client} connections already (the most "
                                          "one address may)")
                transport.write(raw_error(503, f"this client holds {g.limits.per_client} connections already "
                                               "(the most one address may)", "too_many_connections", "server_error"))
                transport.close()
                return
            oldest = next(iter(waiting))
            g.quiet.warning("evicted", "a client at its cap of %d connections: its oldest one still sending "
                            "its request is closed", g.limits.per_client)
            oldest._close_waiting()
        self._admitted = True
        g.held[self._host] = g.held.get(self._host, 0) + 1
        super().connection_made(transport)
        self._await("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._stop_waiting()
        self._end_body()
        held = self.guard.held.get(self._host, 1) - 1
        if held > 0:
            self.guard.held[self._host] = held
        else:
            self.guard.held.pop(self._host, None)
        super().connection_lost(exc)

    def _count(self, why: str, message: str) -> None:
        self.guard.refused[why] = self.guard.refused.get(why, 0) + 1
        self.guard.quiet.warning(why, "refused: %s", message)

    def _refuse(self, why: str, status: int, message: str, code: str, headers: bytes = b"",
                answer: bool = True) -> None:
        """Answer the request in hand with an error (unless `answer` is False: a response began) and close."""
        self._count(why, message)
        self._stop_waiting()
        self._answered = True
        if answer:
            self.transport.write(raw_error(status, message, code, "server_error" if status >= 500 else
                                           "invalid_request_error", headers))
        self.transport.close()

    # deadlines: the headers, then the body
    def _await(self, part: str) -> None:
        """Start the deadline for the request's `part` ("headers" or "body"); the connection is one that may be
        closed to make room for its client's next."""
        self._stop_waiting()
        limit = self.guard.limits.header_timeout if part == "headers" else self.guard.limits.body_timeout
        self._deadline = self.loop.call_later(limit * (0.5 + 0.5 * random.random()), self._too_slow, part, limit)
        self.guard.waiting.setdefault(self._host, OrderedDict())[self] = None

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        waiting = self.guard.waiting.get(self._host)
        if waiting is not None:
            waiting.pop(self, None)
            if not waiting:
                del self.guard.waiting[self._host]

    def _close_waiting(self) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.close()

    def _too_slow(self, part: str, limit: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # a response may have begun before the body came (a 404 does not read it): then only close
        answer = part == "headers" or self.cycle is None or not self.cycle.response_started
        self._refuse(part + "_timeout", 408, f"request {part} not received within {limit:g} s", "request_timeout",
                     answer=answer)

    def _end_body(self) -> None:
        if self._in_body:
            self._in_body = False
            self.guard.bodies -= 1

    # parsing: in slices, the sizes checked after each
    def data_received(self, data: bytes) -> None:
        view, limit = memoryview(data), self.guard.limits.max_header_bytes
        for start in range(0, len(data), SLICE):
            if self._answered or self.transport.is_closing():
                return
            if self._in_headers and self._deadline is None and self.cycle is not None:
                self._await("headers")  # the next request on a kept-alive connection
            piece = view[start:start + SLICE]
            if not self._parse(piece):
                return
            if self._in_headers:
                self._header_bytes += len(piece)
                if self._header_bytes > limit:
                    self._refuse("header_size", 431, f"request line and headers over {limit} bytes",
                                 "headers_too_large")
            elif self._trailing:
                self._trailer_bytes += len(piece)
                if self._trailer_bytes > limit:
                    self._refuse("trailer_size", 431, f"request trailers over {limit} bytes", "headers_too_large",
                                 answer=self.cycle is None or not self.cycle.response_started)
            if self._answered:
                self.parser = httptools.HttpRequestParser(self)  # drop what it buffered

    def _parse(self, piece: memoryview) -> bool:
        """Feed the parser as uvicorn does; False when the rest of what arrived is not to be parsed."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError:
            if not self._answered:  # else a callback of ours answered, and stopped the parser
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return False
        return True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_headers:  # else a trailer: dropped (RFC 9110 6.5.1), never a header the app would read
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._stop_waiting()
        self._check_token()
        busy = len(self.tasks) - self.guard.bodies >= self.guard.limits.max_requests
        self._in_body = True
        self.guard.bodies += 1
        self._await("body")
        if not busy:
            super().on_headers_complete()
            return
        self._count("max_requests", f"{self.guard.limits.max_requests} requests answered at once already")
        app, self.app = self.app, _busy
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def _check_token(self) -> None:
        """With a token, a `/v1` request without the right one is answered here, its body unread."""
        gate = self.guard.gate
        if gate.token is None or not _needs_token(self.url):
            return
        given = next((v.decode("latin-1") for n, v in self.headers if n == b"authorization"), None)
        refusal = gate.check(given.removeprefix("Bearer ") if given is not None else None, self._host)
        if refusal is None:
            return
        if refusal.retry_after > 0:
            self._refuse("token_wait", 429, refusal.reason, "too_many_wrong_tokens",
                         b"retry-after: %d\r\n" % refusal.retry_after_s)
        else:
            self._refuse("token", 401, "a valid 'Authorization: Bearer TOKEN' header is required", "invalid_api_key")
        raise _Answered

    def on_chunk_header(self) -> None:
        self._trailing = True

    def on_body(self, body: bytes) -> None:
        self._trailing, self._trailer_bytes = False, 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._end_body()
        self._stop_waiting()
        self._in_headers, self._header_bytes, self._trailing, self._trailer_bytes = True, 0, False, 0

    def send_400_response(self, msg: str) -> None:
        self._stop_waiting()  # uvicorn has logged it (through `_UvicornLog`)
        self.transport.write(raw_error(400, "malformed HTTP request", "bad_http_request"))
        self.transport.close()


def _needs_token(url: bytes) -> bool:
    """Whether a request target is under /v1, read as uvicorn reads its path."""
    path = httptools.parse_url(url).path.decode("latin-1")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return path == "/v1" or path.startswith("/v1/")


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer past `max_requests` (uvicorn's is plain text)."""
    body = json.dumps({"error": {"message": "the server is answering as many requests as it may; retry",
                                 "type": "server_error", "param": None, "code": "too_many_requests"}}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class _UvicornLog:
    """Stands for uvicorn's "uvicorn.error" logger in the protocol and its request cycles: what a client
    can make it say (malformed requests, an exception) goes through the quiet log, each kind once then counted."""

    level = logging.WARNING  # uvicorn compares it with its TRACE level

    def __init__(self, quiet: QuietLog) -> None:
        self._quiet = quiet

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._quiet.warning("uvicorn: " + msg[:60], msg, *args)

    def error(self, msg: str, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        kind = type(exc_info).__name__ if isinstance(exc_info, BaseException) else msg[:60]
        self._quiet.warning("uvicorn: " + kind, msg, *args, exc_info=exc_info)

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        if level >= logging.WARNING:
            self.warning(msg, *args)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        pass

    debug = info


def protocol_class(limits: ConnectionLimits, gate: TokenGate | None = None,
                   quiet: QuietLog | None = None) -> type[GuardedProtocol]:
    """A protocol class for one server: its connections share one `Guard` (the token's `gate`, and `quiet`,
    the server's log)."""
    guard = Guard(limits, gate or TokenGate(None), quiet or QuietLog(log))
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})
