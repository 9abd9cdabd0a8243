"""Which commands a running SGLang can take (checked against its levels), and the numbers-only form a change
takes through SGLang's /set_internal_state, read back exactly or refused; the plugin's settings."""
from __future__ import annotations

import random

import pytest

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import AutoLevel, Inject, PinLevel, Set
from pdtop.sglang_plugin.knobs import (
    AUTO,
    KnobChange,
    Knobs,
    check,
    from_internal_state,
    is_internal_state,
    pin_thresholds,
    to_internal_state,
)
from pdtop.sglang_plugin.settings import Settings, SettingsError

LEVELS = [(132, 0), (112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60), (0, 132)]


def sglang_rule(thresholds: list[int], decode_bs: int) -> int:
    """SGLang 0.5.23's manual rule in adjust_stream_groups: the last row whose threshold the batch reaches."""
    level = 0
    for i, t in enumerate(thresholds):
        if decode_bs >= t:
            level = i + 1
    return level


@pytest.mark.parametrize("level", range(1, 7))
def test_pin_thresholds_make_sglangs_rule_choose_the_level_for_any_batch(level: int) -> None:
    assert {sglang_rule(pin_thresholds(level, 6), bs) for bs in (1, 2, 36, 10**6)} == {level}


def test_commands_become_changes() -> None:
    assert check(PinLevel(3), LEVELS, True) == KnobChange(pinned_level=3)
    assert check(AutoLevel(), LEVELS, True) == KnobChange(pinned_level=AUTO)
    rows = [[p, d, t] for (p, d), t in zip(LEVELS[1:-1], [1, 2, 4, 8, 16, 32], strict=True)]
    change = check(Set(manual_divisions=rows, decode_bs_divisor=9), LEVELS, True)
    assert change == KnobChange(decode_bs_divisor=9, thresholds=(1, 2, 4, 8, 16, 32))
    knobs = Knobs(None, 36, 65536, ()).after(change).after(check(PinLevel(2), LEVELS, True))
    assert knobs == Knobs(2, 9, 65536, (1, 2, 4, 8, 16, 32))
    assert knobs.manual_divisions(LEVELS) == [tuple(r) for r in rows]


@pytest.mark.parametrize(("command", "field"), [
    (PinLevel(0), "level"), (PinLevel(7), "level"), (PinLevel(-1), "level"),
    (Set(sm_group_num=5), "sm_group_num"), (Set(policy="chunked"), "policy"),
    (Set(manual_divisions=[[100, 32, 1]]), "manual_divisions"), (Inject(100), "cmd"),
])
def test_what_sglang_cannot_take_live_is_one_line(command: object, field: str) -> None:
    with pytest.raises(ControlError) as err:
        check(command, LEVELS, True)  # type: ignore[arg-type]
    assert err.value.field == field and "\n" not in err.value.reason


def test_without_pdmux_nothing_is_steered() -> None:
    with pytest.raises(ControlError, match="without --enable-pdmux"):
        check(PinLevel(1), [(132, 132)], False)


def test_a_change_survives_set_internal_state() -> None:
    change = KnobChange(pinned_level=AUTO, decode_bs_divisor=12, split_forward_token_budget=4096,
                        thresholds=(0, 3, 9, 27, 81, 243))
    args = to_internal_state(change, 17, "c4")
    assert is_internal_state(args) and all(isinstance(v, int) for v in args.values())  # SGLang's Dict[str, int|float]
    assert from_internal_state(args) == (change, 17, "c4")
    assert from_internal_state(to_internal_state(KnobChange(thresholds=()), 1, None)) == (KnobChange(thresholds=()), 1,
                                                                                         None)


def test_hand_made_set_internal_state_is_read_exactly_or_refused() -> None:
    rng = random.Random(39)
    keys = ["ticket", "client", "pinned_level", "decode_bs_divisor", "split_forward_token_budget", "thresholds",
            "threshold_0", "threshold_1", "threshold_9", "nonsense"]
    values: list[object] = [-5, -1, 0, 1, 3, 2**40, 2**63, 1.5, True, None, "3", [1]]
    read = refused = 0
    for _ in range(2000):
        args = {"pdtop_" + rng.choice(keys): rng.choice(values) for _ in range(rng.randrange(1, 5))}
        try:
            change, ticket, client = from_internal_state(args)
        except ControlError as exc:
            assert "\n" not in exc.reason
            refused += 1
            continue
        read += 1
        assert from_internal_state(to_internal_state(change, ticket or 0, client)) == (change, ticket or 0, client)
    assert read and refused
    assert not is_internal_state({"pdtop_pinned_level": 1, "pp_max_micro_batch_size": 8})  # SGLang's own: not ours
    assert not is_internal_state({}) and not is_internal_state(None)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"PDTOP_SGLANG_PORT": ""}, None),
    ({"PDTOP_SGLANG_PORT": "8765"}, Settings(8765)),
    ({"PDTOP_SGLANG_PORT": "8765", "PDTOP_SGLANG_HOST": "::1"}, Settings(8765, "::1")),
    ({"PDTOP_SGLANG_PORT": "9", "PDTOP_SGLANG_HOST": "10.0.0.5", "PDTOP_TOKEN": "t"}, Settings(9, "10.0.0.5", "t")),
])
def test_settings(env: dict[str, str], expected: Settings | None) -> None:
    assert Settings.from_env(env) == expected


@pytest.mark.parametrize("env", [
    {"PDTOP_SGLANG_PORT": "-1"}, {"PDTOP_SGLANG_PORT": "65536"}, {"PDTOP_SGLANG_PORT": "80 80"},
    {"PDTOP_SGLANG_PORT": "8765", "PDTOP_SGLANG_HOST": "0.0.0.0"},
])
def test_bad_settings_are_one_line(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert "\n" not in str(err.value)
