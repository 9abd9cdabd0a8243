"""The engine's control commands: one frozen dataclass each, the only place their names are spelled.

A client's JSON object becomes a command once, at the edge (`parse_command`). Making a command
checks everything that does not depend on the engine's state (its fields' types, ranges that
never change), whoever makes it, so a command object is well-formed. What does depend on it (a
level past the last one, a prompt longer than the context, manual divisions that do not fit the
device) is checked once, by the engine's thread, against the state the command meets when it is
applied at a round boundary (`Engine.control`). `to_wire` is the
inverse of `parse_command`: the dashboard and the tuners build commands and send `to_wire()`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from pdtop.engine.errors import ConfigError, ControlError
from pdtop.engine.scheduling.pdmux_config import FIELDS as PDMUX_FIELDS
from pdtop.engine.scheduling.pdmux_config import check_int
from pdtop.engine.scheduling.pdmux_config import validate as validate_field
from pdtop.engine.scheduling.policies import check_policy

SETTABLE = (*PDMUX_FIELDS, "policy", "workload_rate")
MAX_RATE = 1000.0  # workload requests a second
MAX_INJECT_TOKENS = 4096  # an injected request's max_tokens


C = TypeVar("C", bound="Command")


@dataclass(frozen=True)
class Command:
    """What every engine command has: its wire `name`, a `summary` in words, the field a failure
    names when it names none (`subject`), and `from_wire` (its fields, already known to be its own)."""

    name: ClassVar[str]
    summary: ClassVar[str]

    @property
    def subject(self) -> str:
        return self.name

    @classmethod
    def from_wire(cls: type[C], body: dict[str, Any]) -> C:
        return cls()


@dataclass(frozen=True)
class PinLevel(Command):
    """Hold the split at `level` (an index into the levels) instead of choosing it each round."""

    level: int
    name: ClassVar[str] = "pin_level"
    summary: ClassVar[str] = "pin a level"

    @property
    def subject(self) -> str:
        return "level"

    def __post_init__(self) -> None:
        _integer("level", self.level)  # its range is the device's levels: the engine's

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> PinLevel:
        if "level" not in body:
            raise ControlError("level", "missing")
        return cls(body["level"])


@dataclass(frozen=True)
class AutoLevel(Command):
    """Back to the automatic level choice (SGLang's rules)."""

    name: ClassVar[str] = "auto_level"
    summary: ClassVar[str] = "automatic level choice"


@dataclass(frozen=True)
class Inject(Command):
    """A long prompt arrives now: `prompt_tokens` (the workload's long prompt if None), `max_tokens`
    (64 if None)."""

    prompt_tokens: int | None = None
    max_tokens: int | None = None
    name: ClassVar[str] = "inject"
    summary: ClassVar[str] = "inject a long prompt"

    def __post_init__(self) -> None:
        if self.prompt_tokens is not None:
            _integer("prompt_tokens", self.prompt_tokens)  # its range is the model's context: the engine's
        if self.max_tokens is not None:
            _valid(check_int, "max_tokens", self.max_tokens, 1, MAX_INJECT_TOKENS)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Inject:
        for key in ("prompt_tokens", "max_tokens"):
            if key in body and body[key] is None:  # optional means left out, not null
                raise ControlError(key, "must be an integer, got None")
        return cls(body.get("prompt_tokens"), body.get("max_tokens"))


@dataclass(frozen=True)
class PauseWorkload(Command):
    """The workload stops sending arrivals (requests in flight go on)."""

    name: ClassVar[str] = "pause_workload"
    summary: ClassVar[str] = "workload paused: no new arrivals"


@dataclass(frozen=True)
class ResumeWorkload(Command):
    """The workload sends arrivals again."""

    name: ClassVar[str] = "resume_workload"
    summary: ClassVar[str] = "workload resumed"


@dataclass(frozen=True)
class Set(Command):
    """Set any of `SETTABLE`: the pdmux knobs, the policy, the workload's rate. Each value is checked
    here; that they fit the device (manual divisions, say) is the engine's to check."""

    values: dict[str, Any] = field(default_factory=dict)  # never changed once made
    name: ClassVar[str] = "set"
    summary: ClassVar[str] = "set"

    def __post_init__(self) -> None:
        if not self.values:
            raise ControlError("set", f"nothing to set; settable: {', '.join(SETTABLE)}")
        for key in self.values:
            if key not in SETTABLE:
                raise ControlError(key, f"not settable; settable: {', '.join(SETTABLE)}")
        object.__setattr__(self, "values", {key: _valid(_checked, key, value) for key, value in self.values.items()})

    @property
    def subject(self) -> str:
        return ", ".join(self.values)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Set:
        return cls(dict(body))

    def pdmux(self) -> dict[str, Any]:
        """The values that are pdmux knobs."""
        return {k: v for k, v in self.values.items() if k in PDMUX_FIELDS}


def _integer(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(name, f"must be an integer, got {value!r}")


def _valid(checker: Callable[..., Any], *args: Any) -> Any:
    """`checker(*args)`, its ConfigError reported as the ControlError every command raises."""
    try:
        return checker(*args)
    except ConfigError as exc:
        raise ControlError(exc.field, exc.reason) from None


def _checked(key: str, value: Any) -> Any:
    if key == "policy":
        return check_policy(value)
    if key == "workload_rate":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_RATE:
            raise ControlError("workload_rate", f"must be a number in 0..{MAX_RATE:g} requests/s, got {value!r}")
        return float(value)
    return validate_field(key, value)


EngineCommand = PinLevel | AutoLevel | Inject | PauseWorkload | ResumeWorkload | Set
ENGINE_COMMANDS: dict[str, type[EngineCommand]] = {
    c.name: c for c in (PinLevel, AutoLevel, Set, Inject, PauseWorkload, ResumeWorkload)}


def parse_command(msg: Mapping[str, Any]) -> EngineCommand:
    """The command a wire object names (`cmd`, its fields, and an `id` that is not the engine's);
    ControlError names what is wrong (an unknown command, a field it does not take, a bad value)."""
    cmd = msg.get("cmd")
    body = {k: v for k, v in msg.items() if k not in ("cmd", "id")}
    kind = ENGINE_COMMANDS.get(cmd) if isinstance(cmd, str) else None
    if kind is None:
        raise ControlError("cmd", f"unknown command {cmd!r}; known: {', '.join(ENGINE_COMMANDS)}")
    if kind is not Set:
        extra = sorted(set(body) - {f.name for f in fields(kind)})
        if extra:
            raise ControlError(extra[0], f"not a field of {kind.name!r}")
    return kind.from_wire(body)


def to_wire(command: EngineCommand) -> dict[str, Any]:
    """The JSON object `parse_command` reads back as `command` (`cmd` and its fields)."""
    body = dict(command.values) if isinstance(command, Set) else \
        {k: v for k, v in vars(command).items() if v is not None}
    return {"cmd": command.name, **body}
