"""The telemetry and control websocket server (docs/protocol.md).

The engine's sink only appends to a deque (`Inbox`): the engine thread never waits for
the network. A pump task on the event loop takes what arrived every `tick` seconds (at
most `max_event_rate` events a second: the newest; the rest are shed and counted),
encodes each event once and hands the same text to every client's bounded queue and to
the recorder. Clients that asked for `?batch=1` get one `batch` frame per tick instead of
one frame per event. Each client has its own writer task, so a client that stops
reading only loses its own oldest events (reported with `dropped`).
"""
from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed

from pdtop.telemetry import encode as ev
from pdtop.telemetry.recording.recorder import Recorder, RecordingError
from pdtop.telemetry.server.client_queue import ClientQueue, QueueOverflow
from pdtop.telemetry.server.control_channel import handle_control, same_token
from pdtop.telemetry.server.frames import WIRE_MAX_SIZE
from pdtop.telemetry.server.inbox import Inbox

if TYPE_CHECKING:
    from pdtop.engine.engine import Engine

log = logging.getLogger("pdtop.telemetry.server.server")

DIRECT_WRITE_LIMIT = 32 * 1024  # websockets' default high-water mark: above it, queue instead


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(eq=False)
class Client:
    """The server's record of one connection."""

    id: str
    ws: ServerConnection
    queue: ClientQueue
    authorized: bool  # may send control messages
    batch: bool  # asked for `batch` frames
    frames_sent: int = 0


class TelemetryServer:
    """Serve `engine`'s events and control on ws://host:port. Registers its sink with the
    engine at construction; `start()` inside a running event loop, `stop()` to finish."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                 queue_size: int = 1024, tick: float = 0.05, max_event_rate: float = 1000.0,
                 record_path: str | None = None) -> None:
        if token is not None and not token:
            raise ValueError("the token must not be empty")
        if not is_loopback(host) and not token:
            raise ValueError(f"binding {host} (not a loopback address) needs --token")
        self.engine = engine
        self.host, self.port = host, port
        self.token = token
        self.queue_size = queue_size
        self.tick = tick
        self.max_event_rate = max_event_rate
        self.clients: dict[str, Client] = {}
        self.recorder: Recorder | None = None
        self.events_published = 0  # events fanned out
        self.events_shed = 0  # events dropped before fan-out (over max_event_rate)
        self._initial_record = record_path
        self.api_url: str | None = None  # announced in hello: the OpenAI-compatible API beside this server
        self._inbox = Inbox(engine.config_dict)
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._pump_task: asyncio.Task | None = None
        self._closing: set[asyncio.Task[None]] = set()  # the loop holds tasks weakly: keep them until done
        self._last_tick = 0.0
        self._budget = max_event_rate
        engine.add_sink(self._inbox.sink)

    def publish(self, event: dict[str, Any]) -> None:
        """Queue a ready-made event (the hardware sampler's); thread-safe, never blocks."""
        self._inbox.publish(event)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await serve(self._handle, self.host, self.port, compression=None,
                                   max_size=WIRE_MAX_SIZE, max_queue=16)
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        if self._initial_record:
            self.start_recording(self._initial_record)
        self._last_tick = time.monotonic()
        self._pump_task = asyncio.create_task(self._pump(), name="pdtop-telemetry-pump")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving: pending events are sent to the recorder, connections closed (1001)."""
        self.engine.remove_sink(self._inbox.sink)
        if self._pump_task is not None:
            self._pump_task.cancel()
            try:
                await self._pump_task
            except asyncio.CancelledError:
                pass
            self._pump_task = None
            self._drain()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.stop_recording()

    async def __aenter__(self) -> TelemetryServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- recording -------------------------------------------------------------------
    def start_recording(self, path: str) -> Recorder:
        if self.recorder is not None:
            raise RecordingError(f"already recording to {str(self.recorder.path)!r}")
        self.recorder = Recorder(path, self._hello("recorder", True))
        self._inbox.refill(max(0, int(self._budget)))
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
        items, shed = self._inbox.take()
        # token bucket: max_event_rate a second on average, bursts up to one second's worth
        now = time.monotonic()
        elapsed, self._last_tick = now - self._last_tick, now
        self._budget = min(self.max_event_rate, self._budget - len(items) + self.max_event_rate * elapsed)
        clients = list(self.clients.values())
        if not clients and self.recorder is None:
            self._inbox.refill(0)  # nobody listens: the sink only counts
            return
        self._inbox.refill(max(0, int(self._budget)))
        if shed:
            self.events_shed += shed
            self._record(ev.encode(ev.dropped_event(shed)))
        frames: list[str] = []
        for text, priority in items:
            self._record(text)
            if priority:  # a config change is never dropped: every client must see it
                for client in clients:
                    self._send_priority(client, text)
            else:
                frames.append(text)
        if frames or shed:
            self.events_published += len(frames)
            self._fan_out(clients, frames, shed)

    def _fan_out(self, clients: list[Client], frames: list[str], shed: int) -> None:
        """The same text to every client. A batch client that is caught up (nothing queued,
        little unsent) gets its batch written straight to its socket in one `broadcast` call,
        no task switch; every other client's frames go through its queue and writer task."""
        direct: list[ServerConnection] = []
        batch = None
        for client in clients:
            q = client.queue
            if client.batch and not q and _unsent(client.ws) < DIRECT_WRITE_LIMIT:
                direct.append(client.ws)
                client.frames_sent += 1
                continue
            if shed:
                q.lose(shed)
            if not frames:
                continue
            if client.batch:
                batch = batch or _batch(frames)
                q.put(batch, len(frames))
            else:
                for frame in frames:
                    q.put(frame)
        if direct:
            lost = [ev.encode(ev.dropped_event(shed))] if shed else []
            broadcast(direct, _batch(lost + frames))

    def _record(self, frame: str) -> None:
        if self.recorder is None:
            return
        try:
            self.recorder.write(frame)
        except (OSError, ValueError) as exc:
            path = self.stop_recording()
            note = ev.encode(ev.error_event("path", f"recording to {path!r} stopped: {exc}"))
            for client in list(self.clients.values()):
                self._send_priority(client, note)

    def _send_priority(self, client: Client, frame: str) -> None:
        try:
            client.queue.put_priority(frame)
        except QueueOverflow as exc:
            log.warning("closing client %s: %s", client.id, exc)
            self.clients.pop(client.id, None)
            task = asyncio.create_task(client.ws.close(1008, "not reading"))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # -- one connection --------------------------------------------------------------
    def _hello(self, client_id: str, readonly: bool) -> dict[str, Any]:
        return ev.hello_event(client_id, readonly, self.engine.describe(), self.api_url)

    async def _handle(self, ws: ServerConnection) -> None:
        client_id = f"c{next(self._ids)}"
        query = _query(ws)
        given = query.get("token")
        authorized = self.token is None or (given is not None and same_token(given, self.token))
        client = Client(client_id, ws, ClientQueue(self.queue_size), authorized,
                        batch=query.get("batch") in ("1", "true", "yes"))
        client.queue.put_priority(ev.encode(self._hello(client_id, not authorized)))
        if given is not None and not authorized:
            client.queue.put_priority(ev.encode(ev.error_event("token", "wrong token; this connection is read-only")))
        self.clients[client_id] = client
        self._inbox.refill(max(0, int(self._budget)))
        writer = asyncio.create_task(self._write(client), name=f"pdtop-writer-{client_id}")
        try:
            async for message in ws:
                try:
                    reply = handle_control(self, client, message)
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
                while q:
                    if q.priority:
                        frame = q.priority.popleft()
                    elif q.dropped:
                        frame = ev.encode(ev.dropped_event(q.take_dropped()))
                    else:
                        frame = q.pop_stream()
                    await ws.send(frame)
                    client.frames_sent += 1
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writer for %s", client.id)
            await ws.close(1011, "server error")


def _batch(frames: list[str]) -> str:
    return f'{{"type":"batch","v":{ev.PROTOCOL_VERSION},"events":[{",".join(frames)}]}}'


def _unsent(ws: ServerConnection) -> int:
    """Bytes written to the socket's transport but not yet sent (huge if it is gone)."""
    try:
        return ws.transport.get_write_buffer_size()
    except Exception:
        return 1 << 62


def _query(ws: ServerConnection) -> dict[str, str]:
    if ws.request is None:
        return {}
    try:
        return {k: v[0] for k, v in parse_qs(urlsplit(ws.request.path).query).items()}
    except Exception:
        return {}
