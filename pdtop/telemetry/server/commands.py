"""What a control frame can ask: the server's own commands beside the engine's, and the wire form.

`parse_command` turns a frame's JSON object (`frames.parse_control`) into one command, once;
`to_wire` is its inverse, for clients. The engine's commands are `pdtop.engine.scheduling.commands`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling import commands as engine_commands
from pdtop.engine.scheduling.commands import ENGINE_COMMANDS, EngineCommand


@dataclass(frozen=True)
class Auth:
    """Give the server's token: the connection may control from then on."""

    token: str | None = None
    name: ClassVar[str] = "auth"
    summary: ClassVar[str] = "authenticate"

    def __post_init__(self) -> None:
        if self.token is not None and not isinstance(self.token, str):
            raise ControlError("token", "must be a string")


@dataclass(frozen=True)
class RecordStart:
    """Record every event to a new file `path` in the server's recordings directory."""

    path: str
    name: ClassVar[str] = "record_start"
    summary: ClassVar[str] = "start recording"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ControlError("path", "a file path (string) is required")


@dataclass(frozen=True)
class RecordStop:
    """Stop recording (the reply has the file's path)."""

    name: ClassVar[str] = "record_stop"
    summary: ClassVar[str] = "stop recording"


ServerCommand = Auth | RecordStart | RecordStop
Command = ServerCommand | EngineCommand
SERVER_COMMANDS: dict[str, type[ServerCommand]] = {c.name: c for c in (Auth, RecordStart, RecordStop)}
KNOWN = (*ENGINE_COMMANDS, *SERVER_COMMANDS)


def parse_command(msg: dict[str, Any]) -> Command:
    """A control message (a JSON object with a string `cmd`) as its command; ControlError otherwise."""
    cmd = msg.get("cmd")
    kind = SERVER_COMMANDS.get(cmd) if isinstance(cmd, str) else None
    if kind is None:
        if cmd not in ENGINE_COMMANDS:
            raise ControlError("cmd", f"unknown command {cmd!r}; known: {', '.join(KNOWN)}")
        return engine_commands.parse_command(msg)
    body = {k: v for k, v in msg.items() if k not in ("cmd", "id")}
    extra = sorted(set(body) - {f.name for f in fields(kind)})
    if extra:
        raise ControlError(extra[0], f"not a field of {kind.name!r}")
    if kind is RecordStart and "path" not in body:
        raise ControlError("path", "a file path (string) is required")
    return kind(**body)


def to_wire(command: Command, msg_id: Any = None) -> dict[str, Any]:
    """The JSON object that `parse_command` reads back as `command`, with `id` when given."""
    if isinstance(command, (Auth, RecordStart, RecordStop)):
        wire = {"cmd": command.name, **{k: v for k, v in vars(command).items() if v is not None}}
    else:
        wire = engine_commands.to_wire(command)
    return wire if msg_id is None else {**wire, "id": msg_id}
