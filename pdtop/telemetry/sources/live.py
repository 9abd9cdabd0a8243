"""`LiveSource`: a `Source` reading a `pdtop serve` websocket, reconnecting with backoff.

`events()` yields every event (each connection starts with its `hello`) and is also what
delivers replies to `send()`, so keep iterating it while sending. State goes
"connecting" -> "live" (after hello) -> "reconnecting" (connection lost) -> "live" ...,
and "closed" after `close()` or a fatal error (a bad URL, an HTTP error status).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import time
from collections.abc import AsyncIterator, Generator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.client import process_exception
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus, InvalidURI
from websockets.uri import parse_uri

from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.events import WIRE_MAX_SIZE, Batch, ErrorNotice, Hello, Reply
from pdtop.telemetry.server.commands import Command, to_wire
from pdtop.telemetry.sources.source import ControlRefused


def reconnect_delays(first: float = 0.2, cap: float = 5.0) -> Generator[float, None, None]:
    """0.2 s, 0.4 s, ... doubling to 5 s, each with +-25% jitter."""
    delay = first
    while True:
        yield delay * random.uniform(0.75, 1.25)
        delay = min(cap, delay * 2)


def with_query(url: str, **params: str | None) -> str:
    """`url` with these query parameters set (None leaves a parameter out)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in params]
    query += [(k, v) for k, v in params.items() if v]
    return urlunsplit(parts._replace(query=urlencode(query)))


class LiveSource:
    """`token` goes in the URL query (`?token=`); without the server's token the connection
    is read-only (hello says so) and `send` refuses locally, as it does with `readonly=True`.

    The server answers every command once the engine has checked it at a round boundary, and a
    policy switch waits there for the prefills in flight: on a CPU, tens of seconds. So `send` waits
    up to `reply_timeout` (120 s) for that answer; a lost connection fails it at once (the
    keepalive notices a dead one)."""

    def __init__(self, url: str, token: str | None = None, readonly: bool = False, *,
                 reply_timeout: float = 120.0, open_timeout: float = 5.0) -> None:
        """ValueError (one line naming the URL as given) for a URL that is no ws:// or wss:// address."""
        check_ws_url(url)
        self.url = url
        self.token = token  # also the server's API token (`pdtop serve` checks the same one on both ports)
        self.token_refused: str | None = None  # the server's reason when it refused the token ("wrong token")
        # batch=1: one frame per server tick; events() hands them out one by one
        self._connect_url = with_query(url, token=token, batch="1")
        self.want_readonly = readonly
        self.readonly = readonly
        self.state = "connecting"
        self.hello: Hello | None = None
        self.connections = 0  # how many times a connection delivered its hello
        self.reply_timeout = reply_timeout
        self.open_timeout = open_timeout
        self._ws: ClientConnection | None = None
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self.last_error: str | None = None  # why the latest connection attempt failed (None once connected)
        self.retry_at: float | None = None  # time.monotonic() of the next attempt after a failure

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for ws in connect(self._connect_url, compression=None, max_size=WIRE_MAX_SIZE,
                                    open_timeout=self.open_timeout, reconnect_delays=self._delays,
                                    process_exception=self._failed):
                if self._closed:
                    await ws.close()
                    return
                self._ws = ws
                try:
                    async for frame in ws:
                        for event in self._accept(frame):
                            yield event
                except ConnectionClosed:
                    pass
                except BaseException:  # the reader stopped (aclose, cancel): start the close handshake now,
                    asyncio.get_running_loop().create_task(ws.close())  # or the server waits out its timeout
                    raise
                finally:
                    self._ws = None
                    self._fail_pending("connection lost")
                if self._closed:
                    return
                self.state = "reconnecting"
        finally:
            self.state = "closed"
            self._fail_pending("source closed")

    def _failed(self, exc: Exception) -> Exception | None:
        """A connection attempt failed: note why; websockets decides whether to retry."""
        self.last_error = why_not_connected(exc, self.open_timeout)
        return process_exception(exc)

    def _delays(self) -> Generator[float, None, None]:
        for delay in reconnect_delays():
            self.retry_at = time.monotonic() + delay
            yield delay

    def _accept(self, frame: str | bytes) -> list[dict[str, Any]]:
        """A frame -> the events it holds, as received (consumers decode them); a frame that
        is not JSON holds none. Hellos and replies are decoded here, for the connection's state."""
        try:
            event = json.loads(frame)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
            return []
        try:
            typed = decode_event(event)
        except EventError:  # not ours to judge: the consumer skips or reports it
            return [event] if isinstance(event, dict) else []
        if isinstance(typed, Batch):
            return typed.events
        if isinstance(typed, Hello):
            self.hello = typed
            self.readonly = self.want_readonly or typed.readonly
            self.token_refused = None
            self.state = "live"
            self.connections += 1
            self.last_error = self.retry_at = None
        elif isinstance(typed, ErrorNotice) and typed.field == "token":  # sent right after hello
            self.token_refused = typed.reason.split(";")[0]
        elif isinstance(typed, Reply):
            future = self._pending.pop(str(typed.id), None)
            if future is not None and not future.done():
                future.set_result(typed)
        return [event]

    @property
    def readonly_reason(self) -> str | None:
        if self.want_readonly:
            return "attached with --readonly"
        if not self.readonly:
            return None
        if self.token:  # given, and refused
            return (f"the server refused the token ({self.token_refused or 'wrong token'}): attach with the "
                    "server's --token TOKEN or $PDTOP_TOKEN")
        return "no control token: attach with --token TOKEN or set $PDTOP_TOKEN"

    @property
    def transport(self) -> None:
        return None

    async def send(self, command: Command) -> Reply:
        """Send one control command; the reply (ok true) is returned, a refusal raises."""
        if self.readonly:
            raise ControlRefused(None, "read-only connection")
        ws = self._ws
        if ws is None or self.state != "live":
            raise ControlRefused(None, f"not connected ({self.state})")
        msg_id = f"m{next(self._ids)}"
        msg = to_wire(command, msg_id)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        try:
            await ws.send(json.dumps(msg))
            reply = await asyncio.wait_for(future, self.reply_timeout)
        except ConnectionClosed:
            raise ControlRefused(None, "connection lost") from None
        except asyncio.TimeoutError:
            raise ControlRefused(None, f"no reply within {self.reply_timeout:g} s (the engine may still apply it)"
                                 ) from None
        finally:
            self._pending.pop(msg_id, None)
        if not reply.ok:
            error = reply.error
            raise ControlRefused(error.field if error else None, error.reason if error else "refused")
        return reply

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ControlRefused(None, reason))
        self._pending.clear()

    async def close(self) -> None:
        self._closed = True
        self.state = "closed"
        if self._ws is not None:
            await self._ws.close()


def check_ws_url(url: str) -> None:
    """ValueError, in one line naming `url` as given, unless it is a websocket address with a host and a port
    websockets can dial (checked before the query this source adds, so none of it shows)."""
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"not a websocket URL (ws://HOST:PORT): {url!r}")
    try:
        parse_uri(url)
        port = urlsplit(url).port
    except InvalidURI as exc:
        raise ValueError(f"not a websocket address: {url!r} ({str(exc).rsplit(': ', 1)[-1]}; ws://HOST:PORT)") \
            from None
    except ValueError:
        raise ValueError(f"not a websocket address: {url!r} (the port must be a number from 1 to 65535)") from None
    if port == 0:
        raise ValueError(f"not a websocket address: {url!r} (the port must be a number from 1 to 65535)")


def why_not_connected(exc: BaseException, open_timeout: float) -> str:
    """A failed connection attempt in words: `connection refused`, `no answer within 5 s`, ..."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is `pdtop serve` running there?)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"no answer within {open_timeout:g} s"
    if isinstance(exc, InvalidStatus):
        return (f"the server answered HTTP {exc.response.status_code}, not a websocket (a /metrics page is read with "
                "http://HOST:PORT)")
    if isinstance(exc, InvalidMessage):  # an HTTP/1.0 server, or something else: no websocket handshake
        return ("the server did not answer as a websocket server (`pdtop serve` prints its ws:// address; a "
                "/metrics page is read with http://HOST:PORT)")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__
