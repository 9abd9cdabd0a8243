"""The engine's control commands: one frozen dataclass each, the only place their names are spelled.

A client's JSON object becomes a command once, at the edge, by pdtop's one decoder
(`pdtop.telemetry.server.commands.parse_command`: `typed_json.decode_as` over the one table of
every command, the server's too). Making a command, whoever makes it, checks everything that does
not depend on the engine's state: its fields' types, by the same decoder (`typed_json.check_fields`,
so one made in process is as well-formed as one parsed), then `check`'s values (ranges that never
change), each failure a `ControlError` naming the field. What does depend on it (a level past the
last one, a prompt longer than the context, manual divisions that do not fit the device) is checked
once, by the engine's thread, against the state the command meets when it is applied at a round
boundary (`Engine.control`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from pdtop.engine.errors import ConfigError, ControlError
from pdtop.engine.scheduling.pdmux_config import FIELDS as PDMUX_FIELDS
from pdtop.engine.scheduling.pdmux_config import check_value
from pdtop.engine.scheduling.policies import check_policy
from pdtop.typed_json import DecodeError, check_fields

MAX_RATE = 1000.0  # workload requests a second
MAX_INJECT_TOKENS = 4096  # an injected request's max_tokens


@dataclass(frozen=True)
class Command:
    """What every command has: its wire `name`, a `summary` in words, the field a failure names when it
    names none (`subject`), and the checks made when it is made (module doc)."""

    name: ClassVar[str]
    summary: ClassVar[str]

    def __post_init__(self) -> None:
        try:
            check_fields(self)
        except DecodeError as exc:
            raise ControlError(exc.field or self.subject, exc.reason) from None
        self.check()

    def check(self) -> None:
        """The checks of its values that are not types (ranges); ControlError naming the field."""

    @property
    def subject(self) -> str:
        return self.name


@dataclass(frozen=True)
class PinLevel(Command):
    """Hold the split at `level` (an index into the levels) instead of choosing it each round."""

    level: int  # its range is the device's levels: the engine's to check
    name: ClassVar[str] = "pin_level"
    summary: ClassVar[str] = "pin a level"

    @property
    def subject(self) -> str:
        return "level"


@dataclass(frozen=True)
class AutoLevel(Command):
    """Back to the automatic level choice (SGLang's rules)."""

    name: ClassVar[str] = "auto_level"
    summary: ClassVar[str] = "automatic level choice"


@dataclass(frozen=True)
class Inject(Command):
    """A long prompt arrives now: `prompt_tokens` (the workload's long prompt if None; its range is the
    model's context: the engine's), `max_tokens` (64 if None)."""

    prompt_tokens: int | None = None
    max_tokens: int | None = None
    name: ClassVar[str] = "inject"
    summary: ClassVar[str] = "inject a long prompt"

    def check(self) -> None:
        if self.max_tokens is not None and not 1 <= self.max_tokens <= MAX_INJECT_TOKENS:
            raise ControlError("max_tokens", f"must be in 1..{MAX_INJECT_TOKENS}, got {self.max_tokens}")


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


@dataclass(frozen=True, kw_only=True)
class Set(Command):
    """Set the knobs given (None: left as it is; at least one is given): the pdmux knobs, named and typed
    as `PdmuxConfig`'s fields (a test keeps them so), the policy, the workload's rate. Each value is
    checked as a configuration's is (`pdmux_config.check_value`); that they fit the device (manual
    divisions, say) is the engine's to check. A live `set` cannot unset `slo_itl_ms` (None is "not
    given"): `level_rule: sglang` stops using it."""

    sm_group_num: int | None = None
    manual_divisions: list[list[int]] | None = None
    split_forward_token_budget: int | None = None
    max_split_forward_layers: int | None = None
    decode_bs_divisor: int | None = None
    overlap_decode_full_sm: bool | None = None
    chunk_size: int | None = None
    level_rule: str | None = None
    slo_itl_ms: float | None = None
    chunked_prefill_size: int | None = None
    policy: str | None = None
    workload_rate: float | None = None
    name: ClassVar[str] = "set"
    summary: ClassVar[str] = "set"

    def check(self) -> None:
        given = self.given()
        if not given:
            raise ControlError("set", f"nothing to set; settable: {', '.join(SETTABLE)}")
        try:
            for key, value in self.knobs().items():
                object.__setattr__(self, key, check_value(key, value))
            if self.policy is not None:
                check_policy(self.policy)
        except ConfigError as exc:
            raise ControlError(exc.field, exc.reason) from None
        rate = self.workload_rate
        if rate is not None and not 0 <= rate <= MAX_RATE:
            raise ControlError("workload_rate", f"must be a number in 0..{MAX_RATE:g} requests/s, got {rate:g}")

    @property
    def subject(self) -> str:
        return ", ".join(self.given())

    def given(self) -> dict[str, Any]:
        """The knobs given, by name, in `SETTABLE`'s order: what the wire form holds."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    def knobs(self) -> dict[str, Any]:
        """The pdmux knobs given (`PdmuxConfig.replace`'s arguments)."""
        return {f: value for f in PDMUX_FIELDS if (value := getattr(self, f)) is not None}


SETTABLE = tuple(f.name for f in fields(Set))
EngineCommand = PinLevel | AutoLevel | Inject | PauseWorkload | ResumeWorkload | Set
ENGINE_COMMANDS: dict[str, type[EngineCommand]] = {
    c.name: c for c in (PinLevel, AutoLevel, Set, Inject, PauseWorkload, ResumeWorkload)}
