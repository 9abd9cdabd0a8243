"""The dashboard's one table of keys (`KEYMAP`): it drives the footer bindings, the help screen and
the palette.

A key either builds a control command for the engine or server (`build`: the same command
classes the server parses, `pdtop.telemetry.server.commands`), or runs a local app action
(`action`, e.g. theme, SLO, replay transport). Keys that take a value (`arg`) prompt for it
first; `parse` turns the typed text into the value and raises ValueError with a readable
message.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import AutoLevel, Inject, PauseWorkload, PinLevel, ResumeWorkload, Set
from pdtop.engine.scheduling.policies import POLICIES
from pdtop.engine.scheduling.workload import LONG_PROMPT_TOKENS
from pdtop.telemetry.server.commands import Command, RecordStart, RecordStop
from pdtop.ui.state import DashboardState

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Arg:
    """A value the operator types (or, with `choices`, picks from a list) before the command runs."""

    prompt: str
    parse: Callable[[str], Any]
    default: Callable[[DashboardState], str] = lambda state: ""
    choices: tuple[tuple[str, str], ...] = ()  # (value, what it means): shown as a list, not typed


Build = Callable[[DashboardState, Any], Command]


@dataclass(frozen=True)
class KeyCommand:
    id: str
    key: str  # Textual key name ("plus", "question_mark", "R")
    label: str  # short, for the footer
    description: str  # for help and the palette
    build: Build | None = None  # the control command it sends (ValueError: nothing to send)
    needs_write: bool = False  # refused (and hidden) on read-only connections
    mode: str = "live"  # "live" | "replay" | "any"
    arg: Arg | None = None
    action: str | None = None  # local app action (method `action_<name>(value)`)
    key_display: str | None = None
    footer: bool = True  # shown in the footer (all are in help and the palette)

    def available(self, replay: bool) -> bool:
        return self.mode == "any" or (self.mode == "replay") == replay


# ---- value parsers ------------------------------------------------------------------------

def _number(text: str, kind: Callable[[str], N], what: str, low: N) -> N:
    try:
        value = kind(text.strip())  # both take digit-group underscores: 10_000
    except ValueError:
        raise ValueError(f"not {what}: {text!r}") from None
    if not value >= low:  # NaN too
        raise ValueError(f"must be at least {low}: {value}")
    return value


def parse_int(text: str, low: int = 1) -> int:
    return _number(text, int, "a whole number", low)


def parse_float(text: str, low: float = 0.0) -> float:
    return _number(text, float, "a number", low)


_DIVISION_SHAPE = "each division is three whole numbers: prefill units, decode units, decode batch threshold"


def parse_divisions(text: str) -> list[list[int]]:
    """`[[112, 20, 1], [104, 28, 12]]` (JSON) or `112 20 1; 104 28 12`; empty clears them."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list: {exc.msg}") from None
    else:
        rows = [row.replace(",", " ").split() for row in text.split(";") if row.strip()]
    try:
        out = [[int(x) for x in row] for row in rows]
    except (TypeError, ValueError):
        raise ValueError(_DIVISION_SHAPE) from None
    if any(len(row) != 3 for row in out):
        raise ValueError(_DIVISION_SHAPE)
    return out


def parse_policy(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError(f"choose one of {', '.join(POLICIES)}")
    return value  # `Set` checks it, so a typo shows the engine's own reason


POLICY_CHOICES = (
    ("pdmux", "prefill beside decode, on split units"),
    ("chunked", "decode batch + a prompt chunk each step"),
    ("prefill-first", "whole prompts first, decode waits"),
    ("disagg", "a prefill and a decode instance, KV over a link"),
)


def parse_slo_ms(text: str) -> float | None:
    """ITL SLO in milliseconds; empty or 0 removes the line. Returns seconds."""
    text = text.strip().removesuffix("ms").strip()
    if not text or float(text) == 0:
        return None
    return parse_float(text, low=0.001) / 1e3


def parse_tune(text: str) -> tuple[float, float]:
    """Live tuning's `SLO_MS [SECONDS]`: the ITL SLO and how long each candidate is measured (5 s if
    left out). Returns (SLO seconds, dwell seconds)."""
    parts = text.replace(",", " ").split()
    if not 1 <= len(parts) <= 2:
        raise ValueError("give the ITL SLO in ms, then optionally the seconds to measure each candidate")
    slo_ms = parse_float(parts[0].removesuffix("ms"), low=0.001)
    return slo_ms / 1e3, parse_float(parts[1].removesuffix("s"), low=0.1) if len(parts) == 2 else 5.0


def parse_level_rule(text: str) -> dict[str, Any]:
    """`sglang`, or `slo MS`: the level rule (pdtop's `level_rule`, with its `slo_itl_ms`)."""
    parts = text.replace(",", " ").split()
    if parts == ["sglang"]:
        return {"level_rule": "sglang"}
    if len(parts) == 2 and parts[0] == "slo":
        return {"level_rule": "slo", "slo_itl_ms": parse_float(parts[1].removesuffix("ms"), low=0.001)}
    raise ValueError("give `sglang`, or `slo MS` (the ITL SLO in ms)")


def _level_rule_default(state: DashboardState) -> str:
    config = state.config
    if config is None or config.level_rule != "slo" or config.slo_itl_ms is None:
        return "sglang"
    return f"slo {config.slo_itl_ms:g}"


def parse_seconds(text: str) -> float:
    """A replay position: seconds (`42.5`) or `m:ss`."""
    text = text.strip()
    try:
        if ":" in text:
            minutes, seconds = text.split(":", 1)
            return int(minutes) * 60 + float(seconds)
        return float(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (seconds or m:ss)") from None


# ---- message builders ------------------------------------------------------------------------

def _level_step(delta: int) -> Build:
    """Pin the level next to the one on screen (under auto the engine's own level moves each round:
    the operator steps from what they see), or next to the one a press just asked for."""
    def build(state: DashboardState, _value: Any) -> Command:
        n = len(state.levels)
        level = next((x for x in (state.pending_level, state.shown_level, state.level) if x is not None), None)
        if n == 0 or level is None:
            raise ValueError("no split level known yet")
        target = level + delta
        if not 0 <= target < n:
            raise ValueError(f"already at level {level} (levels 0..{n - 1})")
        return PinLevel(target)

    return build


def _set(key: str) -> Build:
    def build(_state: DashboardState, value: Any) -> Command:
        try:
            return Set(**{key: value})
        except ControlError as exc:
            raise ValueError(exc.reason) from None

    return build


def _set_many(values: dict[str, Any]) -> Command:
    try:
        return Set(**values)
    except ControlError as exc:
        raise ValueError(exc.reason) from None


def _workload_toggle(state: DashboardState, _value: Any) -> Command:
    paused = state.config is not None and state.config.workload_paused
    return ResumeWorkload() if paused else PauseWorkload()


def _record_toggle(state: DashboardState, value: Any) -> Command:
    """Stop if recording, else start into `value` or a timestamped file in the server's directory."""
    if state.recording:
        return RecordStop()
    try:
        return RecordStart(value or time.strftime("pdtop-%Y%m%d-%H%M%S.ndjson"))
    except ControlError as exc:
        raise ValueError(exc.reason) from None


def _config_default(key: str, fallback: str = "") -> Callable[[DashboardState], str]:
    """The prompt's text: the setting `key` of the configuration in force (an `EngineConfig` field)."""
    def default(state: DashboardState) -> str:
        if state.config is None:
            return fallback
        value = getattr(state.config, key)
        return json.dumps(value) if isinstance(value, list) else str(value)

    return default


KEYMAP: list[KeyCommand] = [
    # live: the engine's split
    KeyCommand("level_up", "plus", "level up", "level up: more units to decode (pins)", _level_step(+1),
               needs_write=True, key_display="+"),
    KeyCommand("level_down", "minus", "level down", "level down: more units to prefill (pins)", _level_step(-1),
               needs_write=True, key_display="-"),
    KeyCommand(AutoLevel.name, "a", "auto", "automatic level choice", lambda s, v: AutoLevel(), needs_write=True),
    KeyCommand("decode_bs_divisor", "d", "divisor", "set decode_bs_divisor", _set("decode_bs_divisor"),
               needs_write=True, arg=Arg("decode_bs_divisor (decode requests per level step)", parse_int,
                                         _config_default("decode_bs_divisor"))),
    KeyCommand("manual_divisions", "m", "divisions", "edit manual_divisions", _set("manual_divisions"),
               needs_write=True, footer=False,
               arg=Arg("manual_divisions: [[prefill, decode, decode_bs_threshold], ...] or `p d t; p d t` "
                       "(empty: none)", parse_divisions, _config_default("manual_divisions", "[]"))),
    KeyCommand("budget", "b", "budget", "set split_forward_token_budget", _set("split_forward_token_budget"),
               needs_write=True, footer=False,
               arg=Arg("split_forward_token_budget (tokens x layers per prefill round)", parse_int,
                       _config_default("split_forward_token_budget"))),
    KeyCommand("chunk_size", "c", "chunk", "set chunk size (chunked policy)", _set("chunk_size"),
               needs_write=True, footer=False,
               arg=Arg("chunk_size (prompt tokens per chunked step)", parse_int, _config_default("chunk_size"))),
    KeyCommand("level_rule", "l", "rule", "set the level rule: sglang, or slo MS (fewest decode units for an ITL SLO)",
               lambda s, v: _set_many(v), needs_write=True, footer=False,
               arg=Arg("level rule: `sglang`, or `slo MS` (the fewest decode units predicted to meet MS)",
                       parse_level_rule, _level_rule_default)),
    KeyCommand("policy", "p", "policy", "choose the scheduling policy", _set("policy"), needs_write=True,
               arg=Arg("scheduling policy", parse_policy, _config_default("policy", "pdmux"), POLICY_CHOICES)),
    # live: the workload
    KeyCommand("inject", "i", "inject", "inject a long prompt (asks its size)", lambda s, v: Inject(v),
               needs_write=True,
               arg=Arg("prompt tokens of the injected request", parse_int, lambda s: str(LONG_PROMPT_TOKENS))),
    KeyCommand("workload_rate", "r", "rate", "set workload rate (requests/s)", _set("workload_rate"),
               needs_write=True, footer=False,
               arg=Arg("workload_rate (requests per second)", parse_float, _config_default("workload_rate"))),
    KeyCommand("tune", "u", "tune", "live tuning: try each split, keep the best or roll back", mode="live",
               needs_write=True, action="tune", footer=False,
               arg=Arg("live tuning: ITL SLO in ms, then seconds to measure each candidate (e.g. `20 5`)", parse_tune,
                       lambda s: f"{s.itl_slo_s * 1e3:g} 5" if s.itl_slo_s else "")),
    KeyCommand("workload_toggle", "w", "workload", "pause / resume the workload", _workload_toggle, needs_write=True),
    KeyCommand("record", "R", "record", "start / stop recording (on the server)", _record_toggle, needs_write=True,
               key_display="R"),
    # replay transport
    KeyCommand("play_pause", "space", "play/pause", "play / pause", mode="replay", action="replay_toggle",
               key_display="space"),
    KeyCommand("step", "full_stop", "step", "step one round (paused)", mode="replay", action="replay_step",
               key_display="."),
    KeyCommand("seek_back", "left", "-5s", "seek back 5 s", mode="replay", action="replay_seek_relative(-5)",
               key_display="←"),
    KeyCommand("seek_forward", "right", "+5s", "seek forward 5 s", mode="replay", action="replay_seek_relative(5)",
               key_display="→"),
    KeyCommand("seek_to", "g", "go to", "go to a time", mode="replay", action="replay_seek",
               arg=Arg("go to (seconds or m:ss)", parse_seconds, lambda s: "0"), footer=False),
    KeyCommand("slower", "less_than_sign", "slower", "slower (down to 0.25x)", mode="replay", action="replay_speed(-1)",
               key_display="<"),
    KeyCommand("faster", "greater_than_sign", "faster", "faster (up to 16x)", mode="replay", action="replay_speed(1)",
               key_display=">"),
    KeyCommand("freeze", "f", "freeze", "freeze / unfreeze the screen", mode="live",
               action="toggle_freeze"),
    # both
    KeyCommand("itl_slo", "s", "SLO", "set the ITL SLO line (ms)", mode="any", action="set_slo",
               arg=Arg("ITL SLO in ms (empty or 0: none)", parse_slo_ms,
                       lambda s: f"{s.itl_slo_s * 1e3:g}" if s.itl_slo_s else ""), footer=False),
    KeyCommand("theme", "t", "theme", "next theme", mode="any", action="next_theme", footer=False),
    KeyCommand("help", "question_mark", "help", "help: keys and commands", mode="any", action="help", key_display="?"),
    KeyCommand("quit", "q", "quit", "quit", mode="any", action="quit"),
]

BY_ID: dict[str, KeyCommand] = {c.id: c for c in KEYMAP}  # ids and keys are unique (a test checks)
