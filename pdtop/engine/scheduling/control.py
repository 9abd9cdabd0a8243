"""Validation of live control messages.

A message is checked when it arrives against the state it will be applied to: the
engine's, with every change still queued before it (`Plan`). A bad one raises
`ControlError(field, reason)` and changes nothing. A good one is turned into a `Change`
that the engine applies at the next round boundary, checking it again against the state
it really meets; a change that fails there is reported as a `ControlFailure`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.errors import ConfigError, ControlError
from pdtop.engine.scheduling.pdmux_config import FIELDS as PDMUX_FIELDS
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, check_int
from pdtop.engine.scheduling.policies import check_policy
from pdtop.engine.scheduling.splits import SplitTable

COMMANDS = ("pin_level", "auto_level", "set", "inject", "pause_workload", "resume_workload")
SETTABLE = (*PDMUX_FIELDS, "policy", "workload_rate")
MAX_RATE = 1000.0


@dataclass
class Change:
    """A validated message, ready to apply at a round boundary."""

    cmd: str
    values: dict[str, Any] = field(default_factory=dict)
    config: PdmuxConfig | None = None  # the knobs after it, when it sets any
    table: SplitTable | None = None  # new levels when manual_divisions / sm_group_num change
    msg: dict[str, Any] = field(default_factory=dict)  # what was asked, to check again when applied


@dataclass(frozen=True)
class Plan:
    """The knobs and levels a queued change will meet: the engine's, after the changes queued before it."""

    config: PdmuxConfig
    table: SplitTable

    def after(self, change: Change) -> Plan:
        return Plan(change.config or self.config, change.table or self.table)


@dataclass
class ControlFailure:
    """A change accepted when queued that could not be applied (the engine reports it and goes on)."""

    time: float
    round_index: int
    field: str | None
    reason: str
    client: str | None = None


def subject(msg: dict[str, Any]) -> str:
    """The field a message is about, for a failure that names none: what a `set` sets, else its command."""
    if msg.get("cmd") == "set":
        return ", ".join(k for k in msg if k not in ("cmd", "id")) or "set"
    return "level" if msg.get("cmd") == "pin_level" else str(msg.get("cmd"))


def _no_extra(msg: dict, allowed: set[str]) -> None:
    extra = sorted(set(msg) - allowed - {"cmd", "id"})
    if extra:
        raise ControlError(extra[0], f"not a field of {msg['cmd']!r}")


def validate(msg: Any, *, config: PdmuxConfig, table: SplitTable, max_prompt: int) -> Change:
    """Check one control message against `config` and `table` (the state it will be applied to);
    `max_prompt` is the longest prompt the engine can take."""
    try:
        change = _validate(msg, config, table, max_prompt)
    except ConfigError as exc:
        raise ControlError(exc.field, exc.reason) from None
    change.msg = msg
    return change


def _validate(msg: Any, config: PdmuxConfig, table: SplitTable, max_prompt: int) -> Change:
    if not isinstance(msg, dict):
        raise ControlError("message", f"must be a JSON object, got {type(msg).__name__}")
    cmd = msg.get("cmd")
    if not isinstance(cmd, str) or cmd not in COMMANDS:
        raise ControlError("cmd", f"unknown command {cmd!r}; known: {', '.join(COMMANDS)}")
    if cmd == "pin_level":
        _no_extra(msg, {"level"})
        if "level" not in msg:
            raise ControlError("level", "missing")
        return Change(cmd, {"level": check_int("level", msg["level"], 0, len(table.groups) - 1)})
    if cmd == "inject":
        _no_extra(msg, {"prompt_tokens", "max_tokens"})
        values = {}
        if "prompt_tokens" in msg:
            values["prompt_tokens"] = check_int("prompt_tokens", msg["prompt_tokens"], 1, max_prompt)
        if "max_tokens" in msg:
            values["max_tokens"] = check_int("max_tokens", msg["max_tokens"], 1, 4096)
        return Change(cmd, values)
    if cmd != "set":
        _no_extra(msg, set())
        return Change(cmd)
    values = {k: v for k, v in msg.items() if k not in ("cmd", "id")}
    if not values:
        raise ControlError("set", f"nothing to set; settable: {', '.join(SETTABLE)}")
    for name in values:
        if name not in SETTABLE:
            raise ControlError(name, f"not settable; settable: {', '.join(SETTABLE)}")
    change = Change(cmd)
    if "policy" in values:
        change.values["policy"] = check_policy(values.pop("policy"))
    if "workload_rate" in values:
        rate = values.pop("workload_rate")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) \
                or not 0 <= rate <= MAX_RATE:
            raise ControlError("workload_rate", f"must be a number in 0..{MAX_RATE:g} requests/s, got {rate!r}")
        change.values["workload_rate"] = float(rate)
    if values:
        new = config.replace(**values)
        if {"manual_divisions", "sm_group_num"} & set(values):
            change.table = table.rebuilt(new)
        change.config = new
        change.values.update({k: getattr(new, k) for k in values})
    return change
