"""Checking what a client sends before anything acts on it."""
from __future__ import annotations

import json
from typing import Any

MAX_FRAME_BYTES = 64 * 1024  # larger control frames get an error reply
WIRE_MAX_SIZE = 1024 * 1024  # larger frames close the connection (websockets code 1009)


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
