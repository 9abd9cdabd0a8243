"""uvicorn's httptools protocol, guarded against clients that hold connections or send endless headers.

uvicorn alone times out only idle keep-alive connections, has no header size limit with
httptools, and its `limit_concurrency` counts connections, so a few thousand sockets that
connect and send nothing (slowloris) get every other client a 503. Here:
- the request line and headers must arrive within `header_timeout` seconds of the connection
  (or of the first byte of the next request on a kept-alive one), else 408 and closed; each
  connection's deadline is drawn between half of it and all of it, so that sockets opened
  together are not closed, and reopened, together (a burst of 600 stalled every request);
- they may take `max_header_bytes` (16 KiB, as h11), else 431 and closed, before httptools
  buffers more;
- a client (an IP address) holds at most `per_client` connections: at the cap, its oldest
  connection still waiting for its headers is closed to make room, and if none is waiting
  the new one gets a 503;
- `max_requests` counts requests being answered, not connections: sockets that only
  connect never refuse a request;
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
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from pdtop.quiet_log import QuietLog

log = logging.getLogger("pdtop.api")
MAX_HEADER_BYTES = 16 << 10  # h11's default max_incomplete_event_size
HEADER_TIMEOUT_S = 10.0
PER_CLIENT = 1024  # connections one address may hold (500 concurrent streams from one load generator fit)
MAX_REQUESTS = 4096  # requests answered at once


@dataclass
class ConnectionLimits:
    header_timeout: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    per_client: int = PER_CLIENT
    max_requests: int = MAX_REQUESTS


@dataclass
class Guard:
    """What the connections of one server share: the limits, and who holds how many connections."""

    limits: ConnectionLimits
    quiet: QuietLog = field(default_factory=lambda: QuietLog(log))
    held: dict[str, int] = field(default_factory=dict)  # address -> connections open
    # address -> its connections waiting for their headers, oldest first
    waiting: dict[str, OrderedDict[GuardedProtocol, None]] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # why -> connections or requests refused


def raw_error(status: int, message: str, code: str, type: str = "invalid_request_error") -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class GuardedProtocol(HttpToolsProtocol):
    guard: Guard  # set on the subclass `protocol_class` makes for one server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # ours counts requests, in on_headers_complete
        self._host = ""
        self._admitted = False
        self._in_headers = True  # between requests, or reading a request's line and headers
        self._header_bytes = 0
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
                self._refuse(transport, "per_client", 503, f"this client holds {g.limits.per_client} connections "
                             "already (the most one address may)", "too_many_connections")
                return
            oldest = next(iter(waiting))
            g.quiet.warning("evicted", "a client at its cap of %d connections: its oldest one still sending "
                            "headers is closed", g.limits.per_client)
            oldest._close_waiting()
        self._admitted = True
        g.held[self._host] = g.held.get(self._host, 0) + 1
        super().connection_made(transport)
        self._await_headers()

    def _refuse(self, transport: asyncio.Transport, why: str, status: int, message: str, code: str) -> None:
        self.guard.refused[why] = self.guard.refused.get(why, 0) + 1
        self.guard.quiet.warning(why, "refused: %s", message)
        transport.write(raw_error(status, message, code, "server_error" if status >= 500 else
                                  "invalid_request_error"))
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._stop_waiting()
        held = self.guard.held.get(self._host, 1) - 1
        if held > 0:
            self.guard.held[self._host] = held
        else:
            self.guard.held.pop(self._host, None)
        super().connection_lost(exc)

    # headers: a deadline and a size
    def _await_headers(self) -> None:
        self._in_headers, self._header_bytes = True, 0
        if self._deadline is None:
            timeout = self.guard.limits.header_timeout * (0.5 + 0.5 * random.random())
            self._deadline = self.loop.call_later(timeout, self._too_slow)
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

    def _too_slow(self) -> None:
        self._deadline = None
        self._stop_waiting()
        if not self.transport.is_closing():
            self.guard.refused["header_timeout"] = self.guard.refused.get("header_timeout", 0) + 1
            self.guard.quiet.warning("header_timeout", "closed a connection that sent no complete request "
                                     "headers within %g s", self.guard.limits.header_timeout)
            self.transport.write(raw_error(408, f"request headers not received within "
                                                f"{self.guard.limits.header_timeout:g} s", "request_timeout"))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            if self._deadline is None and self.cycle is not None:  # the next request on a kept-alive connection
                self._await_headers()
            end = data.find(b"\r\n\r\n")
            self._header_bytes += end + 4 if end >= 0 else len(data)
            if self._header_bytes > self.guard.limits.max_header_bytes:
                self._stop_waiting()
                limit = self.guard.limits.max_header_bytes
                self.guard.refused["header_size"] = self.guard.refused.get("header_size", 0) + 1
                self.guard.quiet.warning("header_size", "refused request headers over %d bytes", limit)
                self.transport.write(raw_error(431, f"request line and headers over {limit} bytes",
                                               "headers_too_large"))
                self.transport.close()
                self.parser = httptools.HttpRequestParser(self)  # drop what it buffered
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._stop_waiting()
        if len(self.tasks) < self.guard.limits.max_requests:
            super().on_headers_complete()
            return
        self.guard.refused["max_requests"] = self.guard.refused.get("max_requests", 0) + 1
        self.guard.quiet.warning("max_requests", "refused a request: %d answered at once already",
                                 self.guard.limits.max_requests)
        app, self.app = self.app, _busy
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers, self._header_bytes = True, 0

    def send_400_response(self, msg: str) -> None:
        self._stop_waiting()  # uvicorn has logged it (through `_UvicornLog`)
        self.transport.write(raw_error(400, "malformed HTTP request", "bad_http_request"))
        self.transport.close()


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


def protocol_class(limits: ConnectionLimits, quiet: QuietLog | None = None) -> type[GuardedProtocol]:
    """A protocol class for one server: its connections share one `Guard` (and `quiet`, the server's log)."""
    guard = Guard(limits) if quiet is None else Guard(limits, quiet)
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})
