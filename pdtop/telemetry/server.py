"""The telemetry and control websocket server (docs/protocol.md).

The engine's sink only appends to a deque: the engine thread never waits for the
network. A pump task on the event loop takes what arrived every `tick` seconds, turns
each record into an event, encodes it once and hands the same text to every client's
bounded queue (and the recorder). Each client has its own writer task, so one client
that stops reading only loses its own oldest events (reported with `dropped`).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
from collections import deque
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from pdtop.engine.records import ConfigChange
from pdtop.telemetry import events as ev
from pdtop.telemetry.client_queue import ClientQueue, QueueOverflow
from pdtop.telemetry.frames import WIRE_MAX_SIZE, FrameError, parse_control
from pdtop.telemetry.recorder import Recorder, RecordingError

log = logging.getLogger("pdtop.telemetry.server")

SERVER_COMMANDS = ("auth", "record_start", "record_stop")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Client:
    def __init__(self, client_id: str, ws: ServerConnection, queue: ClientQueue, authorized: bool) -> None:
        self.id = client_id
        self.ws = ws
        self.queue = queue
        self.authorized = authorized


class TelemetryServer:
    """Serve `engine`'s events and control. Call `start()` inside a running event loop,
    then `engine.add_sink(server.sink)` is already done for you."""

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                 queue_size: int = 1024, tick: float = 0.01, inbox_size: int = 100_000,
                 record_path: str | None = None) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(f"binding {host} (not a loopback address) needs --token")
        if token is not None and not token:
            raise ValueError("the token must not be empty")
        self.engine = engine
        self.host, self.port = host, port
        self.token = token
        self.queue_size = queue_size
        self.tick = tick
        self.clients: dict[str, Client] = {}
        self.recorder: Recorder | None = None
        self._initial_record = record_path
        self._inbox: deque[Any] = deque()
        self._inbox_size = inbox_size
        self._inbox_dropped = 0  # written by the engine thread only
        self._inbox_reported = 0
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._pump_task: asyncio.Task | None = None
        self.events_published = 0
        engine.add_sink(self.sink)

    # -- producers (any thread) ------------------------------------------------------
    def sink(self, record: Any) -> None:
        """Engine sink: O(1), never blocks. A ConfigChange captures the config right after it."""
        if len(self._inbox) >= self._inbox_size:
            self._inbox_dropped += 1
            return
        if isinstance(record, ConfigChange):
            self._inbox.append((record, self.engine.config_dict()))
        else:
            self._inbox.append(record)

    def publish(self, event: dict[str, Any]) -> None:
        """Queue a ready-made event (the hardware sampler's); thread-safe, never blocks."""
        if len(self._inbox) < self._inbox_size:
            self._inbox.append(event)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await serve(self._handle, self.host, self.port, compression=None,
                                   max_size=WIRE_MAX_SIZE, max_queue=16)
        sock = next(iter(self._server.sockets))
        self.port = sock.getsockname()[1]
        if self._initial_record:
            self.start_recording(self._initial_record)
        self._pump_task = asyncio.create_task(self._pump(), name="pdtop-telemetry-pump")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    async def stop(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            try:
                await self._pump_task
            except asyncio.CancelledError:
                pass
            self._pump_task = None
            self._drain()
        if self._server is not None:
            self._server.close()  # closes every connection with 1001 going away
            await self._server.wait_closed()
            self._server = None
        self.stop_recording()

    async def __aenter__(self) -> "TelemetryServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- recording -------------------------------------------------------------------
    def start_recording(self, path: str) -> Recorder:
        if self.recorder is not None:
            raise RecordingError(f"already recording to {str(self.recorder.path)!r}")
        self.recorder = Recorder(path, self._hello("recorder", True))
        return self.recorder

    def stop_recording(self) -> str | None:
        if self.recorder is None:
            return None
        rec, self.recorder = self.recorder, None
        rec.close()
        return str(rec.path)

    # -- fan-out ---------------------------------------------------------------------
    async def _pump(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                self._drain()
                if self.recorder is not None:
                    self.recorder.maybe_flush()
            except Exception:  # a bad record must not stop the stream
                log.exception("telemetry pump")

    def _drain(self) -> None:
        inbox = self._inbox
        if self._inbox_dropped != self._inbox_reported:
            lost = self._inbox_dropped - self._inbox_reported
            self._inbox_reported += lost
            frame = ev.encode(ev.dropped_event(lost))
            for client in list(self.clients.values()):
                self._send_priority(client, frame)
        while inbox:
            item = inbox.popleft()
            try:
                if isinstance(item, dict):
                    event = item
                elif isinstance(item, tuple):
                    event = ev.config_event(*item)
                else:
                    event = ev.record_event(item)
                frame = ev.encode(event)
            except Exception:
                log.exception("cannot encode %r", type(item).__name__)
                continue
            self.events_published += 1
            if self.recorder is not None:
                try:
                    self.recorder.write(frame)
                except (OSError, ValueError) as exc:
                    self._recording_failed(exc)
            if event["type"] == "config":
                for client in list(self.clients.values()):
                    self._send_priority(client, frame)
            else:
                for client in self.clients.values():
                    client.queue.put(frame)

    def _recording_failed(self, exc: Exception) -> None:
        path = self.stop_recording()
        frame = ev.encode(ev.error_event("path", f"recording to {path!r} stopped: {exc}"))
        for client in list(self.clients.values()):
            self._send_priority(client, frame)

    def _send_priority(self, client: Client, frame: str) -> None:
        try:
            client.queue.put_priority(frame)
        except QueueOverflow as exc:
            log.warning("closing client %s: %s", client.id, exc)
            self.clients.pop(client.id, None)
            asyncio.ensure_future(client.ws.close(1008, "not reading"))

    # -- one connection --------------------------------------------------------------
    def _hello(self, client_id: str, readonly: bool) -> dict[str, Any]:
        return ev.hello_event(client_id, readonly, self.engine.describe())

    async def _handle(self, ws: ServerConnection) -> None:
        client_id = f"c{next(self._ids)}"
        given = _query_token(ws)
        authorized = self.token is None or (given is not None and _same(given, self.token))
        client = Client(client_id, ws, ClientQueue(self.queue_size), authorized)
        client.queue.put_priority(ev.encode(self._hello(client_id, not authorized)))
        if given is not None and not authorized:
            client.queue.put_priority(ev.encode(ev.error_event("token", "wrong token; this connection is read-only")))
        self.clients[client_id] = client
        writer = asyncio.create_task(self._write(client), name=f"pdtop-writer-{client_id}")
        try:
            async for message in ws:
                try:
                    reply = self._on_message(client, message)
                except Exception as exc:  # no input may crash the server
                    log.exception("control message from %s", client_id)
                    reply = ev.reply_event(None, False, None, f"internal error: {type(exc).__name__}")
                self._send_priority(client, ev.encode(reply))
        except ConnectionClosed:
            pass
        finally:
            self.clients.pop(client_id, None)
            writer.cancel()

    async def _write(self, client: Client) -> None:
        q, ws = client.queue, client.ws
        try:
            while True:
                await q.wake.wait()
                q.wake.clear()
                while q.priority or q.stream:
                    if q.priority:
                        frame = q.priority.popleft()
                    elif q.dropped:
                        frame = ev.encode(ev.dropped_event(q.take_dropped()))
                    else:
                        frame = q.stream.popleft()
                    await ws.send(frame)
                    q.sent += 1
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writer for %s", client.id)
            await ws.close(1011, "server error")

    # -- control ---------------------------------------------------------------------
    def _on_message(self, client: Client, message: str | bytes) -> dict[str, Any]:
        try:
            msg = parse_control(message)
        except FrameError as exc:
            return ev.reply_event(exc.msg_id, False, exc.field, exc.reason)
        msg_id, cmd = msg.get("id"), msg["cmd"]
        if cmd == "auth":
            return self._auth(client, msg_id, msg.get("token"))
        if not client.authorized:
            return ev.reply_event(msg_id, False, "token", "read-only connection: control needs the server's token")
        if cmd == "record_start":
            path = msg.get("path")
            if not isinstance(path, str) or not path:
                return ev.reply_event(msg_id, False, "path", "a file path (string) is required")
            try:
                rec = self.start_recording(path)
            except RecordingError as exc:
                return ev.reply_event(msg_id, False, "path", str(exc))
            return ev.reply_event(msg_id, True, path=str(rec.path))
        if cmd == "record_stop":
            path = self.stop_recording()
            if path is None:
                return ev.reply_event(msg_id, False, "cmd", "not recording")
            return ev.reply_event(msg_id, True, path=path)
        body = {k: v for k, v in msg.items() if k != "id"}
        try:
            self.engine.control(body, client=client.id)
        except Exception as exc:
            field, reason = getattr(exc, "field", None), getattr(exc, "reason", None)
            if reason is None:  # not a ControlError: the engine failed, the server goes on
                log.warning("engine.control(%r) raised %r", body, exc)
                reason = f"{type(exc).__name__}: {exc}"
            return ev.reply_event(msg_id, False, field, reason)
        return ev.reply_event(msg_id, True)

    def _auth(self, client: Client, msg_id: Any, token: Any) -> dict[str, Any]:
        if self.token is None:
            return ev.reply_event(msg_id, True, readonly=False)
        if isinstance(token, str) and _same(token, self.token):
            client.authorized = True
            return ev.reply_event(msg_id, True, readonly=False)
        return ev.reply_event(msg_id, False, "token", "wrong token")


def _query_token(ws: ServerConnection) -> str | None:
    try:
        values = parse_qs(urlsplit(ws.request.path).query).get("token")
    except Exception:
        return None
    return values[0] if values else None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
