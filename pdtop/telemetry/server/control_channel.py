"""One control frame from a client -> its `reply` event (docs/protocol.md, control).

The frame is checked (`parse_control`: a JSON text frame of at most `MAX_FRAME_BYTES` holding an object
with a string `cmd`) and parsed once into a command (`commands.parse_command`). The server's own commands
(`Auth`, `RecordStart`, `RecordStop`) are answered here at once; the engine's go to
`ControlTarget.control`, whose future the engine resolves at its next round boundary, once it
has checked and applied the command: `Waiting.reply` awaits it without blocking the event loop
and makes the one reply, which carries the change. Each connection may send `CONTROL_RATE`
messages a second (bursts of `CONTROL_BURST`) and have `MAX_WAITING` engine commands waiting for
their outcome; beyond that a message is refused, changing nothing. Wrong tokens are counted per
address, across connections (`TokenGate`). Nothing a client sends raises.
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from pdtop.engine.control import Change
from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import EngineCommand
from pdtop.quiet_log import QuietLog
from pdtop.telemetry.encode import reply_event
from pdtop.telemetry.recording.recorder import Recorder, RecordingError
from pdtop.telemetry.server.clients import Client
from pdtop.telemetry.server.commands import Auth, RecordStart, RecordStop, parse_command
from pdtop.token_gate import TokenGate

MAX_FRAME_BYTES = 64 * 1024  # larger control frames get an error reply
MAX_WAITING = 16  # engine commands of one connection waiting for the engine's outcome


class FrameError(Exception):
    """A frame that is not a control message; `field` is None or the offending field."""

    def __init__(self, reason: str, field: str | None = None, msg_id: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
        self.msg_id = msg_id


def parse_control(frame: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """A websocket frame -> a control message dict with a string `cmd`, or `FrameError`."""
    if isinstance(frame, (bytes, bytearray, memoryview)):
        raise FrameError("binary frames are not accepted; send a JSON text frame")
    size = len(frame.encode("utf-8", errors="replace")) if len(frame) * 4 > max_bytes else len(frame)
    if size > max_bytes:
        raise FrameError(f"frame too large ({size} bytes; the limit is {max_bytes})")
    try:
        msg = json.loads(frame)
    except ValueError:
        raise FrameError("not JSON; a control message is a JSON object") from None
    except RecursionError:
        raise FrameError("nested too deeply; a control message is a flat JSON object") from None
    if not isinstance(msg, dict):
        raise FrameError(f"a control message is a JSON object, not {type(msg).__name__}")
    msg_id = msg.get("id")
    if isinstance(msg_id, (dict, list)):
        raise FrameError("id must be a string, number or null", field="id")
    cmd = msg.get("cmd")
    if not isinstance(cmd, str) or not cmd:
        raise FrameError("missing or not a string", field="cmd", msg_id=msg_id)
    return msg


class ControlTarget(Protocol):
    """What a control channel acts on (the telemetry server)."""

    gate: TokenGate
    quiet: QuietLog

    def control(self, command: EngineCommand, client: str) -> Future[Change]:
        """Queue an engine command; the future resolves with its change or a ControlError."""

    def start_recording(self, path: str) -> Recorder: ...

    def stop_recording(self) -> str | None: ...


@dataclass(eq=False)
class Waiting:
    """An engine command on its way through the engine: its reply once the engine has given its outcome."""

    target: ControlTarget
    client: Client
    msg_id: Any
    future: Future[Change]

    async def reply(self) -> dict[str, Any]:
        """The reply: `ok` with the change, or the refusal. The command stays queued in the engine if
        the connection goes meanwhile (`shield`): what a client asked is applied all the same."""
        try:
            change = await asyncio.shield(asyncio.wrap_future(self.future))
        except ControlError as exc:
            return reply_event(self.msg_id, False, exc.field, exc.reason)
        except Exception as exc:  # the engine failed to apply it: report it, keep serving
            self.target.quiet.warning("engine.control", "engine.control raised %r", exc)
            return reply_event(self.msg_id, False, None, f"{type(exc).__name__}: {exc}")
        finally:
            self.client.waiting -= 1
        return reply_event(self.msg_id, True, change=change.changes)


def handle_control(target: ControlTarget, client: Client, frame: str | bytes) -> dict[str, Any] | Waiting:
    """The `reply` event to one frame from `client`, or for an engine command the reply to wait for."""
    try:
        msg = parse_control(frame)
    except FrameError as exc:
        return reply_event(exc.msg_id, False, exc.field, exc.reason)
    msg_id = msg.get("id")
    if not client.messages.take():
        return reply_event(msg_id, False, "cmd", f"too many control messages: at most "
                                  f"{client.messages.rate:g} a second on one connection; nothing was changed")
    try:
        command = parse_command(msg)
    except ControlError as exc:
        if not client.authorized and msg["cmd"] != Auth.name:  # a read-only connection learns no more
            return _read_only(msg_id)
        return reply_event(msg_id, False, exc.field, exc.reason)
    match command:
        case Auth(token=token):
            refusal = target.gate.check(token, client.host)
            if refusal is None:
                client.authorized = True
                return reply_event(msg_id, True, readonly=False)
            return reply_event(msg_id, False, "token", refusal.reason)
        case _ if not client.authorized:
            return _read_only(msg_id)
        case RecordStart(path=path):
            try:
                rec = target.start_recording(path)
            except RecordingError as exc:
                return reply_event(msg_id, False, "path", str(exc))
            return reply_event(msg_id, True, path=str(rec.path))
        case RecordStop():
            try:
                stopped = target.stop_recording()
            except RecordingError as exc:
                return reply_event(msg_id, False, "path", str(exc))
            if stopped is None:
                return reply_event(msg_id, False, "cmd", "not recording")
            return reply_event(msg_id, True, path=stopped)
    if client.waiting >= MAX_WAITING:
        return reply_event(msg_id, False, "cmd", f"too many commands waiting for the engine: at most {MAX_WAITING} "
                                                 "on one connection; nothing was changed")
    try:
        future = target.control(command, client.id)
    except Exception as exc:  # the engine could not queue it: report it, keep serving
        target.quiet.warning("engine.control", "engine.control(%.200r) raised %r", command, exc)
        return reply_event(msg_id, False, None, f"{type(exc).__name__}: {exc}")
    client.waiting += 1
    return Waiting(target, client, msg_id, future)


def _read_only(msg_id: Any) -> dict[str, Any]:
    return reply_event(msg_id, False, "token", "read-only connection: control needs the server's token")
