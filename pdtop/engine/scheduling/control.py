"""Checking a control command against the state it will be applied to.

A command is checked when it arrives against the engine's state with every change still
queued before it (`Plan`). A bad one raises `ControlError(field, reason)` and changes
nothing. A good one becomes a `Change` that the engine applies at the next round boundary,
checked again there against the state it really meets; a change that fails there is
reported as a `ControlFailure` (`pdtop.engine.records`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.errors import ConfigError, ControlError
from pdtop.engine.scheduling.commands import EngineCommand, Inject, PinLevel, Set
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, check_int
from pdtop.engine.scheduling.splits import SplitTable


@dataclass(frozen=True)
class Change:
    """A command checked against a state, ready to apply at a round boundary."""

    command: EngineCommand
    config: PdmuxConfig | None = None  # the knobs after it, when it sets any
    table: SplitTable | None = None  # new levels when manual_divisions / sm_group_num / overlap change


@dataclass(frozen=True)
class Plan:
    """The knobs and levels a queued change will meet: the engine's, after the changes queued before it."""

    config: PdmuxConfig
    table: SplitTable

    def after(self, change: Change) -> Plan:
        return Plan(change.config or self.config, change.table or self.table)


def check(command: EngineCommand, *, config: PdmuxConfig, table: SplitTable, max_prompt: int) -> Change:
    """`command` against `config` and `table` (the state it will be applied to); `max_prompt` is the
    longest prompt the engine can take. ControlError if it cannot apply there."""
    try:
        match command:
            case PinLevel(level=level):
                check_int("level", level, 0, len(table.groups) - 1)
            case Inject(prompt_tokens=tokens) if tokens is not None:
                check_int("prompt_tokens", tokens, 1, max_prompt)
            case Set() if values := command.pdmux():
                new = config.replace(**values)
                rebuilt = {"manual_divisions", "sm_group_num", "overlap_decode_full_sm"} & set(values)
                return Change(command, new, table.rebuilt(new) if rebuilt else None)
    except ConfigError as exc:
        raise ControlError(exc.field, exc.reason) from None
    return Change(command)
