"""Control commands and config changes in plain words, for notifications and chart marks."""
from __future__ import annotations

import os
from typing import Any

from pdtop.engine.scheduling.commands import Inject, PinLevel, Set
from pdtop.format import count, units
from pdtop.telemetry.server.commands import Command
from pdtop.ui.state import DashboardState

# one letter per setting, for the marks on the step-time chart (docs/dashboard.md lists them)
MARKS = {"pinned_level": "L", "decode_bs_divisor": "d", "policy": "p", "manual_divisions": "m", "levels": "m",
         "split_forward_token_budget": "b", "chunk_size": "c", "workload_rate": "r", "workload_paused": "w",
         "inject": "i"}
# each mark in a word, for the chart's legend where the latest change in words does not fit (80 columns)
MARK_WORDS = {"L": "level", "d": "divisor", "p": "policy", "m": "divisions", "b": "budget", "c": "chunk", "r": "rate",
              "w": "workload", "i": "inject", "*": "other"}
_SETTINGS = {"decode_bs_divisor": "decode_bs_divisor", "split_forward_token_budget": "split_forward_token_budget",
             "chunk_size": "chunk size", "workload_rate": "workload rate", "policy": "policy"}


def level_words(state: DashboardState, level: int) -> str:
    """`level 3: prefill 96 SMs, decode 36`."""
    levels = state.levels
    if not 0 <= level < len(levels):
        return f"level {level}"
    p, d = levels[level]
    return f"level {level}: prefill {units(p, state.info.unit_name)}, decode {d}"


def shared_side(state: DashboardState, level: int) -> str | None:
    """What pinning `level` does to a side left with no units of its own, else None.

    No device stalls that side: its work time-shares the other side's units (docs/levels.md), so
    both run, each slower, and nothing isolates decode from prefill."""
    levels = state.levels
    if not 0 <= level < len(levels):
        return None
    p, d = levels[level]
    unit = state.info.unit_name
    if d == 0:
        return f"decode has no {unit} of its own: it time-shares prefill's {units(p, unit)}, both slower (a: automatic)"
    if p == 0:
        return f"prefill has no {unit} of its own: it time-shares decode's {units(d, unit)}, both slower (a: automatic)"
    return None


def _divisions(value: Any) -> str:
    if not value:
        return "none"
    return ", ".join(f"{p}/{d} from batch {t}" for p, d, t in value)


def _setting(name: str, old: Any, new: Any) -> str:
    if name == "manual_divisions":
        return f"manual divisions: {_divisions(new)}"
    if name == "workload_rate":
        return f"workload rate {old:g} → {new:g} requests/s" if old is not None else f"workload rate {new:g}/s"
    label = _SETTINGS.get(name, name)
    return f"{label} {old} → {new}" if old is not None else f"{label} {new}"


def asked(command: Command, state: DashboardState) -> str:
    """What an accepted command does, said before its `config` event comes back."""
    match command:
        case PinLevel(level=level):
            return f"pinned {level_words(state, level)}"
        case Inject(prompt_tokens=tokens):
            return f"injected a prompt of {count(tokens)} tokens" if tokens is not None else "injected a long prompt"
        case Set():
            config, parts = state.config, []
            for name, new in command.given().items():
                old = getattr(config, name, None) if config is not None else None
                text = _setting(name, old, new)
                if name == "policy" and state.prefills and new != old:
                    text += " (once the prefill in flight is done)"
                parts.append(text)
            return "; ".join(parts)
    return command.summary


def change_words(changes: dict[str, dict[str, Any]], state: DashboardState) -> str:
    """A `config` event's changes in words."""
    parts = []
    for name, diff in changes.items():
        old, new = diff.get("old"), diff.get("new")
        if name == "pinned_level":
            parts.append(f"pinned {level_words(state, new)}" if new is not None else "automatic level choice")
        elif name == "inject":
            parts.append(f"injected a prompt of {count(new)} tokens" if isinstance(new, int)
                         else "injected a long prompt")
        elif name == "workload_paused":
            parts.append("workload paused" if new else "workload resumed")
        elif name == "levels":
            parts.append(f"{len(new)} split levels" if isinstance(new, list) else "new split levels")
        else:
            parts.append(_setting(name, old, new))
    return "; ".join(parts)


def change_mark(changes: dict[str, Any]) -> str:
    """The letter a change is marked with on the chart (the first setting it changed)."""
    for name in changes:
        if name in MARKS:
            return MARKS[name]
    return "*"


def api_words(api: str | None, token: str | None, readonly: bool) -> str:
    """How to call the server's OpenAI-compatible API (`hello.api`), for the help: its address and the
    `Authorization` header it wants. The server checks the same token on both ports, so a connection
    that may control (with a token, or to a server without one) knows; `$PDTOP_TOKEN` is named, not shown."""
    if not api:
        return ""
    if readonly:
        return f"OpenAI-compatible API: {api}  ·  it takes the server's token: -H 'Authorization: Bearer TOKEN'"
    if not token:
        return f"OpenAI-compatible API: {api}  ·  the server has no token: curl {api}/models"
    shown = "$PDTOP_TOKEN" if token == os.environ.get("PDTOP_TOKEN") else token
    return f"OpenAI-compatible API: {api}  ·  curl -H \"Authorization: Bearer {shown}\" {api}/models"
