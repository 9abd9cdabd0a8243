"""One control message from a client -> the `reply` event (docs/protocol.md, control).

Server commands (`auth`, `record_start`, `record_stop`) are handled here; the rest go to
`engine.control`, which validates them at once. Each connection may send `CONTROL_RATE`
messages a second (bursts of `CONTROL_BURST`) and try `auth` about once a second; beyond
that a message is refused, changing nothing. Nothing a client sends raises.
"""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from pdtop.engine.scheduling.control import ControlError
from pdtop.telemetry import encode as ev
from pdtop.telemetry.recording.recorder import RecordingError
from pdtop.telemetry.server.frames import FrameError, parse_control

if TYPE_CHECKING:  # the server calls in here with itself: no import at run time
    from pdtop.telemetry.server.clients import Client
    from pdtop.telemetry.server.server import TelemetryServer


def same_token(a: str, b: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a.encode(), b.encode())


def handle_control(server: TelemetryServer, client: Client, message: str | bytes) -> dict[str, Any]:
    """The `reply` event to one message from `client`, a connection of `server`."""
    try:
        msg = parse_control(message)
    except FrameError as exc:
        return ev.reply_event(exc.msg_id, False, exc.field, exc.reason)
    msg_id, cmd = msg.get("id"), msg["cmd"]
    if not client.messages.take():
        return ev.reply_event(msg_id, False, "cmd", f"too many control messages: at most {client.messages.rate:g} "
                              "a second on one connection; nothing was changed")
    if cmd == "auth":
        if not client.auths.take():
            return ev.reply_event(msg_id, False, "token", "too many auth attempts; wait a second")
        return _auth(server, client, msg_id, msg.get("token"))
    if not client.authorized:
        return ev.reply_event(msg_id, False, "token", "read-only connection: control needs the server's token")
    if cmd == "record_start":
        path = msg.get("path")
        if not isinstance(path, str) or not path:
            return ev.reply_event(msg_id, False, "path", "a file path (string) is required")
        try:
            rec = server.start_recording(path)
        except RecordingError as exc:
            return ev.reply_event(msg_id, False, "path", str(exc))
        return ev.reply_event(msg_id, True, path=str(rec.path))
    if cmd == "record_stop":
        try:
            path = server.stop_recording()
        except RecordingError as exc:
            return ev.reply_event(msg_id, False, "path", str(exc))
        if path is None:
            return ev.reply_event(msg_id, False, "cmd", "not recording")
        return ev.reply_event(msg_id, True, path=path)
    body = {k: v for k, v in msg.items() if k != "id"}
    try:
        server.engine.control(body, client=client.id)
    except ControlError as exc:
        return ev.reply_event(msg_id, False, exc.field, exc.reason)
    except Exception as exc:  # the engine failed to validate: report it, keep serving
        server.quiet.warning("engine.control", "engine.control(%.200r) raised %r", body, exc)
        return ev.reply_event(msg_id, False, None, f"{type(exc).__name__}: {exc}")
    return ev.reply_event(msg_id, True)


def _auth(server: TelemetryServer, client: Client, msg_id: Any, token: Any) -> dict[str, Any]:
    if server.token is None:
        return ev.reply_event(msg_id, True, readonly=False)
    if isinstance(token, str) and same_token(token, server.token):
        client.authorized = True
        return ev.reply_event(msg_id, True, readonly=False)
    return ev.reply_event(msg_id, False, "token", "wrong token")
