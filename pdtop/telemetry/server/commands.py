"""What a control frame can ask: the server's own commands, the one table of every command, and the wire form.

`parse_command` turns a frame's JSON object (`control_channel.parse_control`) into one command, once, by
pdtop's one decoder (`typed_json.decode_as`, closed: a field the command does not take, or a null,
is refused) over `COMMANDS`, the engine's commands (`pdtop.engine.scheduling.commands`) and the
server's; `to_wire` is its inverse, for clients. A command checks itself when it is made
(`Command`), so a parsed one and one made in process are checked alike.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import ENGINE_COMMANDS, EngineCommand
from pdtop.engine.scheduling.commands import Command as CommandBase
from pdtop.typed_json import DecodeError, decode_as, show


@dataclass(frozen=True)
class Auth(CommandBase):
    """Give the server's token: the connection may control from then on."""

    token: str | None = None
    name: ClassVar[str] = "auth"
    summary: ClassVar[str] = "authenticate"


@dataclass(frozen=True)
class RecordStart(CommandBase):
    """Record every event to a new file `path` in the server's recordings directory: a plain file name
    (or names of directories inside it, then one), no control character anywhere (a name is shown in
    replies, listings and terminals). Where it leads is the recordings directory's to check."""

    path: str
    name: ClassVar[str] = "record_start"
    summary: ClassVar[str] = "start recording"

    def check(self) -> None:
        if not self.path:
            raise ControlError("path", "a file name is required")
        bad = next((c for c in self.path if unicodedata.category(c) in ("Cc", "Cf", "Cs")), None)
        if bad is not None:
            raise ControlError("path", f"a recording's name holds no control or format character; "
                                       f"{show(self.path)} holds {bad!r}")


@dataclass(frozen=True)
class RecordStop(CommandBase):
    """Stop recording (the reply has the file's path)."""

    name: ClassVar[str] = "record_stop"
    summary: ClassVar[str] = "stop recording"


ServerCommand = Auth | RecordStart | RecordStop
Command = ServerCommand | EngineCommand
SERVER_COMMANDS: dict[str, type[ServerCommand]] = {c.name: c for c in (Auth, RecordStart, RecordStop)}
COMMANDS: dict[str, type[Command]] = {**ENGINE_COMMANDS, **SERVER_COMMANDS}  # every command, by its wire name
KNOWN = tuple(COMMANDS)


def parse_command(msg: Mapping[str, Any]) -> Command:
    """The command a control message names (a JSON object: `cmd`, its fields, and an `id` that is not the
    command's); ControlError names what is wrong (an unknown command, a field it does not take, a
    missing one, a bad value)."""
    cmd = msg.get("cmd")
    kind = COMMANDS.get(cmd) if isinstance(cmd, str) else None
    if kind is None:
        raise ControlError("cmd", f"unknown command {show(cmd)}; known: {', '.join(KNOWN)}")
    body = {k: v for k, v in msg.items() if k not in ("cmd", "id")}
    try:
        return decode_as(kind, body, kind.name, closed=True)
    except DecodeError as exc:
        raise ControlError(exc.field or "cmd", exc.reason) from None


def to_wire(command: Command, msg_id: Any = None) -> dict[str, Any]:
    """The JSON object that `parse_command` reads back as `command` (`cmd` and the fields given), with
    `id` when given."""
    wire = {"cmd": command.name, **{f.name: v for f in fields(command) if (v := getattr(command, f.name)) is not None}}
    return wire if msg_id is None else {**wire, "id": msg_id}
