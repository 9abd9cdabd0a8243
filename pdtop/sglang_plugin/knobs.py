"""What pdtop may change in a running SGLang, checked against its levels: the knobs, a change, its two wire forms.

SGLang reads `self.pdmux_config` at every switch point (`adjust_stream_groups`) and every prefill
slice, so `decode_bs_divisor`, `split_forward_token_budget` and the `decode_bs_threshold` column of
`manual_divisions` can change between rounds. Its levels cannot: the green contexts and CUDA graphs
are built at start, so a change of SM counts is refused. A pin is not a field of SGLang's: it is held
by handing SGLang's own `adjust_stream_groups` thresholds that select the pinned level
(`pin_thresholds`), so whenever prefill and decode both run, SGLang's method returns the pinned level,
and the whole-device ends (one side idle) stay SGLang's choice. The ends cannot be pinned.

With several ranks a change must reach all of them in the same round. It then travels through
SGLang's own `/set_internal_state`, whose request carries numbers only (`server_args: Dict[str,
int | float]`): `to_internal_state` writes a change as `pdtop_*` keys, `from_internal_state` reads
them back on each rank, which checks them again (anyone who can reach that endpoint can send them).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeGuard

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import AutoLevel, EngineCommand, PinLevel, Set

AUTO = -1  # `KnobChange.pinned_level`: back to SGLang's own choice
PREFIX = "pdtop_"  # the /set_internal_state keys of a change
FAR = 2**62  # a threshold no decode batch reaches
MAX_LEVELS = 256  # more split levels than any GPU has SMs for
NO_PDMUX = "this SGLang server runs without --enable-pdmux: it has no split to steer (watch-only)"
STEERED = "decode_bs_divisor, split_forward_token_budget and the manual_divisions thresholds"
FIXED_AT_START = {
    "sm_group_num": "new SM counts need a restart: SGLang builds its green contexts and CUDA graphs at start",
    "policy": "SGLang chooses its scheduling loop at start (--enable-pdmux); it cannot change while it runs",
    "chunk_size": "SGLang's --chunked-prefill-size is fixed at start",
    "chunked_prefill_size": "SGLang's --chunked-prefill-size is fixed at start",
    "workload_rate": "SGLang has no built-in workload: its requests come from its clients",
}


@dataclass(frozen=True)
class Knobs:
    """What pdtop steers in a running SGLang: the pin and the live fields of its `PDMuxConfig`."""

    pinned_level: int | None
    decode_bs_divisor: int
    split_forward_token_budget: int
    thresholds: tuple[int, ...]  # manual_divisions' decode_bs_threshold column; (): the divisor rule

    def manual_divisions(self, levels: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """`manual_divisions` as SGLang's YAML writes it: each split level's SMs with its threshold."""
        return [(p, d, t) for (p, d), t in zip(levels[1:-1], self.thresholds, strict=False)]

    def after(self, change: KnobChange) -> Knobs:
        new = self
        if change.pinned_level is not None:
            new = replace(new, pinned_level=None if change.pinned_level == AUTO else change.pinned_level)
        if change.decode_bs_divisor is not None:
            new = replace(new, decode_bs_divisor=change.decode_bs_divisor)
        if change.split_forward_token_budget is not None:
            new = replace(new, split_forward_token_budget=change.split_forward_token_budget)
        if change.thresholds is not None:
            new = replace(new, thresholds=change.thresholds)
        return new


@dataclass(frozen=True)
class KnobChange:
    """One checked command: the knobs it sets (None: left as they are)."""

    pinned_level: int | None = None  # a level, or AUTO
    decode_bs_divisor: int | None = None
    split_forward_token_budget: int | None = None
    thresholds: tuple[int, ...] | None = None  # (): back to the divisor rule


def check(command: EngineCommand, levels: list[tuple[int, int]], pdmux: bool) -> KnobChange:
    """`command` as a change of SGLang's knobs; ControlError (one line) when SGLang cannot take it live."""
    if not pdmux:
        raise ControlError("cmd", NO_PDMUX)
    if isinstance(command, PinLevel):
        if command.level < 0:  # not AUTO
            raise ControlError("level", f"must be a level, got {command.level}")
        change = KnobChange(pinned_level=command.level)
    elif isinstance(command, AutoLevel):
        change = KnobChange(pinned_level=AUTO)
    elif isinstance(command, Set):
        change = _set(command, levels)
    else:
        raise ControlError("cmd", f"{command.name}: SGLang's requests come from its own clients; "
                                  "pdtop has no workload to steer there")
    verify(change, levels)
    return change


def _set(command: Set, levels: list[tuple[int, int]]) -> KnobChange:
    values = command.given()
    for key in values:
        if key in FIXED_AT_START:
            raise ControlError(key, FIXED_AT_START[key])
        if key not in ("decode_bs_divisor", "split_forward_token_budget", "manual_divisions"):
            raise ControlError(key, f"pdtop does not steer {key} in SGLang; it steers {STEERED}")
    thresholds = None
    if "manual_divisions" in values:
        rows = values["manual_divisions"]
        splits = levels[1:-1]
        if rows and [(p, d) for p, d, _ in rows] != splits:
            raise ControlError("manual_divisions", "new SM counts need a restart (SGLang builds its green contexts "
                                                   f"at start): keep each row's SMs as the levels' {splits} and "
                                                   "change only the thresholds")
        thresholds = tuple(t for _, _, t in rows)
    return KnobChange(decode_bs_divisor=values.get("decode_bs_divisor"),
                      split_forward_token_budget=values.get("split_forward_token_budget"), thresholds=thresholds)


def verify(change: KnobChange, levels: list[tuple[int, int]]) -> None:
    """What depends on the levels: a pin between the whole-device ends, one threshold per split level;
    and thresholds SGLang can run with."""
    n = len(levels)
    level = change.pinned_level
    if level is not None and level != AUTO and not 1 <= level <= n - 2:
        raise ControlError("level", f"SGLang's levels to pin are 1..{n - 2}: 0 and {n - 1} are its whole-device "
                                    "ends, which it uses when prefill or decode is idle")
    if change.thresholds and len(change.thresholds) != n - 2:
        raise ControlError("manual_divisions", f"SGLang has {n - 2} split levels: give one row for each")
    if change.thresholds and min(change.thresholds) > 1:  # SGLang's scan would leave the level unassigned
        raise ControlError("manual_divisions", "no threshold is 1 or less: a decode batch of 1 would reach no row "
                                               "and SGLang 0.5.23's adjust_stream_groups would fail "
                                               "(UnboundLocalError); give a division threshold 1 or 0")


def pin_thresholds(level: int, splits: int) -> list[int]:
    """Thresholds under which SGLang's manual rule picks `level` (1..splits) for every decode batch: it
    takes the last row whose threshold the batch reaches."""
    return [0 if i < level else FAR for i in range(splits)]


def to_internal_state(change: KnobChange, ticket: int, client: str | None) -> dict[str, int]:
    """The change as /set_internal_state's `server_args` (numbers only): `ticket` tells rank 0 which
    control message it answers, `client` who asked (`c12` -> 12)."""
    out = {PREFIX + "ticket": ticket}
    if client is not None and client[1:].isdigit():
        out[PREFIX + "client"] = int(client[1:])
    for name in ("pinned_level", "decode_bs_divisor", "split_forward_token_budget"):
        value = getattr(change, name)
        if value is not None:
            out[PREFIX + name] = value
    if change.thresholds is not None:
        out[PREFIX + "thresholds"] = len(change.thresholds)
        out.update({f"{PREFIX}threshold_{i}": t for i, t in enumerate(change.thresholds)})
    return out


def is_internal_state(args: object) -> TypeGuard[Mapping[str, object]]:
    """A /set_internal_state request made by `to_internal_state` (every key pdtop's)."""
    return isinstance(args, Mapping) and bool(args) and all(isinstance(k, str) and k.startswith(PREFIX) for k in args)


def from_internal_state(args: Mapping[str, object]) -> tuple[KnobChange, int | None, str | None]:
    """The change, ticket and client a /set_internal_state request carries; ControlError if it is not one
    `to_internal_state` could have written."""
    def number(key: str, low: int, high: int = FAR) -> int | None:
        value = args.get(PREFIX + key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
            raise ControlError(key, f"must be an integer in {low}..{high - 1}, got {value!r:.40}")
        return value

    count = number("thresholds", 0, MAX_LEVELS)
    known = {"ticket", "client", "pinned_level", "decode_bs_divisor", "split_forward_token_budget", "thresholds",
             *(f"threshold_{i}" for i in range(count or 0))}
    extra = sorted(k for k in args if k[len(PREFIX):] not in known)
    if extra:
        raise ControlError(extra[0], "not a field pdtop sends")
    # any integers, in any order, as SGLang takes them (the last row a decode batch reaches wins)
    thresholds = None if count is None else tuple(number(f"threshold_{i}", -FAR) or 0 for i in range(count))
    client = number("client", 0)
    change = KnobChange(pinned_level=number("pinned_level", AUTO), decode_bs_divisor=number("decode_bs_divisor", 1),
                        split_forward_token_budget=number("split_forward_token_budget", 1), thresholds=thresholds)
    return change, number("ticket", 0), None if client is None else f"c{client}"
