"""The telemetry and control websocket server (docs/protocol.md).

The engine's sink only appends to a deque (`Inbox`): the engine thread never waits for
the network. A pump task on the event loop takes what arrived every `tick` seconds (at
most `max_event_rate` events a second: the newest; the rest are shed and counted),
encodes each event once and hands the same text to every client (`clients.fan_out`) and to
the recorder. Clients that asked for `?batch=1` get one `batch` frame per tick instead of
one frame per event. Each client has its own writer task, so a client that stops
reading only loses its own oldest events (reported with `dropped`).

Hostile clients: handshakes from a browser page (an `Origin` not allowed) are refused
(HTTP 403), connections beyond `max_clients` too (HTTP 503). With a token, the last eighth
of the slots (`reserved`) is kept for connections that give it: watchers without it cannot
lock the operator out. Wrong tokens are counted per address across connections, and past a
few each makes the address wait longer (`TokenGate`). A connection's replies go out in the
order of its messages, each engine command's once the engine has applied or refused it
(`control_channel.Waiting`); at most `REPLIES_QUEUED` wait to be sent, then its next message
is not read, so a client that floods without reading only stalls itself. Control messages are
rate-limited per connection, and problems a flood repeats are logged once with a count (`QuietLog`).
"""
from __future__ import annotations

import asyncio
import errno
import http
import ipaddress
import itertools
import logging
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Origin

from pdtop.quiet_log import QuietLog
from pdtop.telemetry.encode import encode, reply_event, wire
from pdtop.telemetry.events import WIRE_MAX_SIZE, Dropped, ErrorNotice, Event, Hello, ServerRecording
from pdtop.telemetry.recording.record_dir import open_new_in, recordings_dir
from pdtop.telemetry.recording.recorder import Recorder, RecordingError
from pdtop.telemetry.server.clients import Client, ClientQueue, QueueOverflow, fan_out
from pdtop.telemetry.server.control_channel import Waiting, handle_control
from pdtop.telemetry.server.inbox import Inbox, merge_configs
from pdtop.token_gate import NO_TOKEN, GuessBudget, Refusal, TokenGate

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pdtop.engine.control import Change
    from pdtop.engine.description import EngineConfig, EngineDescription
    from pdtop.engine.scheduling.commands import EngineCommand
    from pdtop.engine.sinks import Sink

log = logging.getLogger("pdtop.telemetry.server.server")
REPLIES_QUEUED = 64  # replies of one connection waiting to be sent before its next message is read


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Served(Protocol):
    """What the server serves: pdtop's `Engine`, or an SGLang scheduler (`pdtop.sglang_plugin.tap`)."""

    def config_record(self) -> EngineConfig: ...

    def describe(self) -> EngineDescription: ...

    def add_sink(self, sink: Sink) -> None: ...

    def remove_sink(self, sink: Sink) -> None: ...

    def control(self, command: EngineCommand, client: str | None = None) -> Future[Change]: ...


class TelemetryServer:
    """Serve `engine`'s events and control on ws://host:port. `start()` inside a running event
    loop, `stop()` to finish. Its sink is registered with the engine only while a client or the
    recorder listens: with nobody listening, telemetry costs the engine's rounds nothing.

    `allow_origins`: browser origins allowed to connect (none by default: the dashboard and
    other programs send no `Origin`). `record_dir`: where a client's `RecordStart` may create files
    (default the working directory). `max_clients`: connections served at once. `guesses`: where
    wrong tokens are counted (`pdtop serve` shares one with its API)."""

    def __init__(self, engine: Served, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                 queue_size: int = 1024, tick: float = 0.05, max_event_rate: float = 1000.0,
                 record_path: str | None = None, allow_origins: Sequence[str] = (),
                 record_dir: str | Path | None = None, max_clients: int = 64,
                 guesses: GuessBudget | None = None) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(f"binding {host} (not a loopback address) needs --token")
        if max_clients < 1:
            raise ValueError(f"max_clients must be at least 1, got {max_clients}")
        self.engine = engine
        self.host, self.port = host, port
        self.gate = TokenGate(token, guesses)  # raises on an empty token
        self.queue_size = queue_size
        self.tick = tick
        self.max_event_rate = max_event_rate
        self.allow_origins = tuple(allow_origins)
        self.record_dir = recordings_dir(record_dir)
        self.max_clients = max_clients
        # slots only a connection with the token may take (none without a token: everyone may control)
        self.reserved = min(max_clients - 1, max(1, max_clients // 8)) if token else 0
        self._refusals: weakref.WeakKeyDictionary[ServerConnection, Refusal | None] = weakref.WeakKeyDictionary()
        self.clients: dict[str, Client] = {}
        self.recorder: Recorder | None = None
        self.events_published = 0  # events fanned out
        self.events_shed = 0  # events dropped before fan-out (over max_event_rate)
        self.quiet = QuietLog(log)
        self._initial_record = record_path
        self.api_url: str | None = None  # announced in hello: the OpenAI-compatible API beside this server
        self._inbox = Inbox(engine.config_record)
        self._shed_seen = 0  # the inbox's shed count at the last drain
        self._recorder_shed_base = 0
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._pump_task: asyncio.Task | None = None
        self._closing: set[asyncio.Task[None]] = set()  # the loop holds tasks weakly: keep them until done
        self._last_tick = 0.0
        self._budget = max_event_rate
        self._loop_handler: Any = None  # the event loop's exception handler before ours
        self._hooked = False  # the inbox's sink is registered with the engine

    def control(self, command: EngineCommand, client: str) -> Future[Change]:
        """A client's engine command, queued for the engine's next round boundary."""
        return self.engine.control(command, client=client)

    def publish(self, event: Event) -> None:
        """Queue a ready-made event (the hardware sampler's); thread-safe, never blocks."""
        self._inbox.publish(event)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)
        origins = [None, *map(Origin, self.allow_origins)]  # None: programs, which send no Origin
        self._server = await serve(self._handle, self.host, self.port, compression=None, max_size=WIRE_MAX_SIZE,
                                   max_queue=16, origins=origins, process_request=self._admit)
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        if self._initial_record:
            self.start_recording(self._initial_record, confined=False)
        self._last_tick = time.monotonic()
        self._pump_task = asyncio.create_task(self._pump(), name="pdtop-telemetry-pump")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving: pending events are sent to the recorder, connections closed (1001)."""
        self._listen(False)
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
        try:
            self.stop_recording()
        except RecordingError as exc:
            log.warning("%s", exc)
        self.quiet.flush()
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() == self._loop_exception:  # not if another server set its own since
            loop.set_exception_handler(self._loop_handler)

    async def __aenter__(self) -> TelemetryServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Out of file descriptors, asyncio pauses accepting for a second and logs a traceback for
        every try: one line with a count is enough (clients already connected are still served)."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self.quiet.warning("accept", "refusing new connections for now: %s", exc.strerror)
        elif self._loop_handler is not None:
            self._loop_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    # -- recording -------------------------------------------------------------------
    def start_recording(self, path: str, *, confined: bool = True) -> Recorder:
        """Record to `path`: a new file inside `record_dir` (a client's request), or with
        `confined=False` any file, created or overwritten (the operator's `--record`)."""
        if self.recorder is not None:
            raise RecordingError(f"already recording to {str(self.recorder.path)!r}")
        hello = wire(self._hello("recorder", True, recording=False))
        if confined:
            real, file = open_new_in(self.record_dir, path)
            try:
                self.recorder = Recorder(real, hello, file=file, name=path)
            except RecordingError:  # its header could not be written (a full disk): leave no empty file
                real.unlink(missing_ok=True)
                raise
        else:
            self.recorder = Recorder(path, hello)
        self._listen(True)
        self._inbox.refill(max(0, int(self._budget)))
        self._recorder_shed_base = self._inbox.shed_total
        return self.recorder

    def stop_recording(self) -> str | None:
        """Stop recording; the file's path, or None if there was no recording. RecordingError
        if its last data could not be written (it is stopped all the same)."""
        if self.recorder is None:
            return None
        rec, self.recorder = self.recorder, None
        rec.close()
        return str(rec.path)

    def _record(self, frame: str) -> None:
        if self.recorder is None:
            return
        try:
            self.recorder.write(frame)
        except RecordingError as exc:
            self._recording_failed(exc)

    def _recording_failed(self, exc: RecordingError) -> None:
        """A write failed (a full disk): the recording stops, every client is told, the stream goes on."""
        rec, self.recorder = self.recorder, None
        log.warning("recording stopped: %s", exc)
        note = encode(ErrorNotice("path", f"recording to {str(rec.path) if rec else '?'!r} stopped: {exc}"))
        for client in list(self.clients.values()):
            self._send_priority(client, note)

    # -- fan-out ---------------------------------------------------------------------
    def _listen(self, on: bool) -> None:
        """Register the inbox's sink with the engine, or take it off. Off, nothing is counted as
        shed: a client or recording that starts later has lost nothing it was there for."""
        if on and not self._hooked:
            self.engine.add_sink(self._inbox.sink)
        elif not on and self._hooked:
            self.engine.remove_sink(self._inbox.sink)
            self._inbox.refill(0)
        self._hooked = on

    async def _pump(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                self._drain()
                if self.recorder is not None:
                    self.recorder.maybe_flush()
            except RecordingError as exc:
                self._recording_failed(exc)
            except Exception:  # a bad record must not stop the stream
                self.quiet.warning("pump", "telemetry pump", exc_info=True)

    def _drain(self) -> None:
        items, shed_total = self._inbox.take()
        shed_before, self._shed_seen = self._shed_seen, shed_total
        shed = shed_total - shed_before
        frames = [item.text for item in items if item.lane == "stream"]
        # token bucket: max_event_rate stream events a second on average, bursts up to one second's worth
        now = time.monotonic()
        elapsed, self._last_tick = now - self._last_tick, now
        self._budget = min(self.max_event_rate, self._budget - len(frames) + self.max_event_rate * elapsed)
        clients = list(self.clients.values())
        if not clients and self.recorder is None:
            self._listen(False)  # nobody listens: what the engine does meanwhile is nobody's loss
            return
        self._inbox.refill(max(0, int(self._budget)))
        self.events_shed += shed
        recorder_lost = shed_total - max(shed_before, self._recorder_shed_base)
        if recorder_lost > 0:
            self._record(encode(Dropped(recorder_lost)))
        configs: list[str] = []
        for item in items:
            self._record(item.text)
            if item.lane == "config":
                configs.append(item.text)
        if configs:  # a config event is never dropped: every client must see it; one a tick is enough
            merged = merge_configs(configs)
            for client in clients:
                self._send_priority(client, merged)
        if frames or shed:
            self.events_published += len(frames)
            fan_out(clients, frames, shed_before, shed_total)

    def _send_priority(self, client: Client, frame: str) -> None:
        if client.closing:
            return
        try:
            client.queue.put_priority(frame)
        except QueueOverflow as exc:
            self.quiet.warning("not reading", "closing client %s (not reading): %s", client.id, exc)
            client.closing = True
            self.clients.pop(client.id, None)
            task = asyncio.create_task(client.ws.close(1008, "not reading"))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # -- one connection --------------------------------------------------------------
    def _hello(self, client_id: str, readonly: bool, recording: bool = True) -> Hello:
        """`recording`: say what the server records (not in the recorder's own header: the file is the recording)."""
        now = ServerRecording(str(self.recorder.path) if self.recorder is not None else None) if recording else None
        return Hello(client_id=client_id, readonly=readonly, engine=self.engine.describe(), api=self.api_url,
                     recording=now)

    def _admit(self, ws: ServerConnection, request: Request) -> Response | None:
        """Before the handshake completes: check the URL's token, and refuse a connection over `max_clients`,
        or a read-only one over `max_clients - reserved` (HTTP 503)."""
        if len(self.clients) >= self.max_clients:
            self.quiet.warning("max clients", "refusing a connection: %d clients already", len(self.clients))
            return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "too many clients\n")
        refusal = self.gate.check(_query(request.path).get("token"), _host(ws))
        if refusal is not None and self._watchers() >= self.max_clients - self.reserved:
            self.quiet.warning("max watchers", "refusing a read-only connection: the last %d slots are kept for "
                               "clients with the token", self.reserved)
            return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, f"too many clients without the token (the last "
                                                                   f"{self.reserved} slots need it)\n")
        self._refusals[ws] = refusal
        return None

    def _watchers(self) -> int:
        """Connections that may not control."""
        return sum(not c.authorized for c in self.clients.values())

    async def _handle(self, ws: ServerConnection) -> None:
        refusal = self._refusals.pop(ws, NO_TOKEN if self.gate.token else None)
        if len(self.clients) >= self.max_clients or (  # several handshakes passed `_admit` at once
                refusal is not None and self._watchers() >= self.max_clients - self.reserved):
            await ws.close(1013, "too many clients")
            return
        client_id = f"c{next(self._ids)}"
        query = _query(ws.request.path if ws.request is not None else "")
        authorized = refusal is None
        client = Client(client_id, ws, ClientQueue(self.queue_size), authorized,
                        batch=query.get("batch") in ("1", "true", "yes"), host=_host(ws))
        writer: asyncio.Task[None] | None = None
        replier: asyncio.Task[None] | None = None
        try:
            # listening before the hello goes out: a client that has its hello misses no event after it (the
            # queue waits for the writer, which starts after the hello)
            self.clients[client_id] = client
            self._listen(True)
            self._inbox.refill(max(0, int(self._budget)))
            client.shed_base = self._inbox.shed_total
            await ws.send(encode(self._hello(client_id, not authorized)))  # before any other frame
            if refusal is not None and refusal is not NO_TOKEN:
                await ws.send(encode(ErrorNotice("token", f"{refusal.reason}; this connection is read-only")))
            writer = asyncio.create_task(self._write(client), name=f"pdtop-writer-{client_id}")
            replies: asyncio.Queue[dict[str, Any] | Waiting] = asyncio.Queue(REPLIES_QUEUED)
            replier = asyncio.create_task(self._reply(client, replies), name=f"pdtop-replies-{client_id}")
            async for message in ws:
                if client.closing:
                    break
                try:
                    answer = handle_control(self, client, message)
                except Exception as exc:  # no input may crash the server
                    self.quiet.warning("control", "control message from %s", client_id, exc_info=True)
                    answer = reply_event(None, False, None, f"internal error: {type(exc).__name__}")
                await replies.put(answer)  # full: the next message waits (a client not reading stalls itself)
        except ConnectionClosed:
            pass
        finally:
            self.clients.pop(client_id, None)
            for task in (writer, replier):
                if task is not None:
                    task.cancel()

    async def _reply(self, client: Client, replies: asyncio.Queue[dict[str, Any] | Waiting]) -> None:
        """Each reply in the order of the messages, an engine command's once the engine has given its outcome."""
        try:
            while True:
                answer = await replies.get()
                await client.ws.send(encode(await answer.reply() if isinstance(answer, Waiting) else answer))
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            self.quiet.warning("replies", "replies to %s", client.id, exc_info=True)
            await client.ws.close(1011, "server error")

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
                        frame = encode(Dropped(q.take_dropped()))
                    else:
                        frame = q.pop_stream()
                    await ws.send(frame)
                    client.frames_sent += 1
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            self.quiet.warning("writer", "writer for %s", client.id, exc_info=True)
            await ws.close(1011, "server error")


def _query(path: str) -> dict[str, str]:
    try:
        return {k: v[0] for k, v in parse_qs(urlsplit(path).query).items()}
    except Exception:
        return {}


def _host(ws: ServerConnection) -> str:
    """The peer's address ("" if the socket is gone)."""
    try:
        return str(ws.remote_address[0])
    except Exception:
        return ""
