"""Control commands on the wire: one class each, parsed once; `to_wire` is the inverse of parsing."""
from __future__ import annotations

import pytest

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import AutoLevel, Inject, PauseWorkload, PinLevel, ResumeWorkload, Set
from pdtop.telemetry.server.commands import KNOWN, Auth, RecordStart, RecordStop, parse_command, to_wire

EVERY = [PinLevel(3), AutoLevel(), Inject(), Inject(2048), Inject(2048, 8), PauseWorkload(), ResumeWorkload(),
         Set(decode_bs_divisor=12, policy="chunked", manual_divisions=[[112, 20, 1]]),
         Set(workload_rate=2.5), Auth("secret"), Auth(), RecordStart("run.ndjson"), RecordStop()]


@pytest.mark.parametrize("command", EVERY, ids=lambda c: f"{c.name}")
def test_parsing_the_wire_form_gives_the_command_back(command):
    wire = to_wire(command, "m1")
    assert wire["cmd"] == command.name and wire["id"] == "m1"
    assert parse_command(wire) == command


def test_the_wire_form_is_protocol_v1():
    """What clients sent before the command classes existed is what they send now."""
    assert to_wire(PinLevel(3)) == {"cmd": "pin_level", "level": 3}
    assert to_wire(Inject(2048)) == {"cmd": "inject", "prompt_tokens": 2048}
    assert to_wire(Set(decode_bs_divisor=12)) == {"cmd": "set", "decode_bs_divisor": 12}
    assert to_wire(RecordStart("a.ndjson")) == {"cmd": "record_start", "path": "a.ndjson"}
    assert to_wire(AutoLevel()) == {"cmd": "auto_level"}


@pytest.mark.parametrize("msg, field", [
    ({"cmd": "explode"}, "cmd"),
    ({"cmd": "record_start"}, "path"),
    ({"cmd": "record_start", "path": ""}, "path"),
    ({"cmd": "record_start", "path": 7}, "path"),
    ({"cmd": "record_stop", "path": "x"}, "path"),
    ({"cmd": "auth", "token": 5}, "token"),
    ({"cmd": "pin_level", "level": "3"}, "level"),
    ({"cmd": "inject", "prompt_tokens": None}, "prompt_tokens"),
    ({"cmd": "inject", "max_tokens": 5000}, "max_tokens"),
    ({"cmd": "set", "policy": "fastest"}, "policy"),
    ({"cmd": "pause_workload", "now": True}, "now"),
])
def test_a_bad_message_names_its_field(msg, field):
    with pytest.raises(ControlError) as err:
        parse_command(msg)
    assert err.value.field == field and err.value.reason


def test_an_unknown_command_lists_every_known_one():
    with pytest.raises(ControlError, match="known: " + ", ".join(KNOWN)):
        parse_command({"cmd": "explode"})
    assert {"pin_level", "record_start", "auth"} <= set(KNOWN)


def test_commands_made_in_process_are_checked_as_parsed_ones():
    """The dashboard and the tuners build commands directly: a bad one cannot be made."""
    with pytest.raises(ControlError, match="decode_bs_divisor"):
        Set(decode_bs_divisor=0)
    with pytest.raises(ControlError, match="nothing to set"):
        Set()
    with pytest.raises(ControlError, match="level"):
        PinLevel(True)


def test_set_has_a_typed_field_for_each_knob():
    """Issue 44 item 3: `Set` has one optional field per settable knob (it held a dict read by string): the
    pdmux knobs with `PdmuxConfig`'s own types, then the policy and the workload's rate; None: not given."""
    import dataclasses
    import typing

    from pdtop.engine.scheduling.pdmux_config import FIELDS, PdmuxConfig

    hints, config = typing.get_type_hints(Set), typing.get_type_hints(PdmuxConfig)
    names = [f.name for f in dataclasses.fields(Set)]
    assert names == [*FIELDS, "policy", "workload_rate"]
    for name in FIELDS:
        assert hints[name] in (config[name] | None, config[name]), name  # `X | None` either way
    command = parse_command({"cmd": "set", "workload_rate": 2, "decode_bs_divisor": 12, "id": 4})
    assert (command.decode_bs_divisor, command.workload_rate, command.policy) == (12, 2.0, None)
    assert command.given() == {"decode_bs_divisor": 12, "workload_rate": 2.0} and command.subject == \
        "decode_bs_divisor, workload_rate"
    assert command.knobs() == {"decode_bs_divisor": 12}
    assert Set(chunked_prefill_size=-1).chunked_prefill_size == 0  # checked as a configuration's value: -1 is off


# One wrong-typed field of each command that has one: refused in the decoder's words, naming the field.
WRONG_TYPE = [
    ({"cmd": "pin_level", "level": True}, "level", "expected an integer, got true"),
    ({"cmd": "inject", "max_tokens": 1.5}, "max_tokens", "expected an integer, got 1.5"),
    ({"cmd": "set", "decode_bs_divisor": "12"}, "decode_bs_divisor", "expected an integer, got '12'"),
    ({"cmd": "set", "manual_divisions": [[112, 20, True]]}, "manual_divisions[0][2]", "expected an integer, got true"),
    ({"cmd": "set", "overlap_decode_full_sm": "no"}, "overlap_decode_full_sm", "expected true or false, got 'no'"),
    ({"cmd": "set", "policy": None}, "policy", "expected a string, got null"),
    ({"cmd": "auth", "token": 5}, "token", "expected a string, got 5"),
    ({"cmd": "record_start", "path": ["a"]}, "path", "expected a string, got a list"),
    ({"cmd": "record_start"}, "path", "missing"),
    ({"cmd": "set", "decode_bs_divisr": 12}, "decode_bs_divisr", "unknown field; known: sm_group_num, "
                                                                 "manual_divisions"),
    ({"cmd": "auto_level", "level": 2}, "level", "unknown field: it takes none"),
]


@pytest.mark.parametrize("msg, field, reason", WRONG_TYPE, ids=lambda x: str(x)[:40])
def test_every_command_is_decoded_by_the_one_decoder(msg, field, reason):
    """Issue 44 item 3: engine and server commands alike go through `typed_json.decode_as` (one table,
    one parse), whose words name the field; their own checks are only those that are not types."""
    with pytest.raises(ControlError) as err:
        parse_command(msg)
    assert err.value.field == field and err.value.reason.startswith(reason), err.value


@pytest.mark.parametrize("path", ["run\n.ndjson", "\x1b]0;pwned\x07.ndjson", "a\x07b", "dir/\x1b[2Jx.ndjson",
                                  "x\u202e.ndjson", "x\x85y", "x\ud800y"])
def test_a_recording_name_holds_no_control_character(path):
    """Issue 38 item 16: names with a newline, ESC or BEL were taken (and shown as given in replies and
    listings). Refused with one line that shows the name with its escapes made visible."""
    with pytest.raises(ControlError) as err:
        parse_command({"cmd": "record_start", "path": path})
    assert err.value.field == "path" and "control" in err.value.reason
    assert not any(c in err.value.reason for c in "\n\x1b\x07\u202e\x85")
    with pytest.raises(ControlError):
        RecordStart(path)
