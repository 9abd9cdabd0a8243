"""Control commands on the wire: one class each, parsed once; `to_wire` is the inverse of parsing."""
from __future__ import annotations

import pytest

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import AutoLevel, Inject, PauseWorkload, PinLevel, ResumeWorkload, Set
from pdtop.telemetry.server.commands import KNOWN, Auth, RecordStart, RecordStop, parse_command, to_wire

EVERY = [PinLevel(3), AutoLevel(), Inject(), Inject(2048), Inject(2048, 8), PauseWorkload(), ResumeWorkload(),
         Set({"decode_bs_divisor": 12, "policy": "chunked", "manual_divisions": [[112, 20, 1]]}),
         Set({"workload_rate": 2.5}), Auth("secret"), Auth(), RecordStart("run.ndjson"), RecordStop()]


@pytest.mark.parametrize("command", EVERY, ids=lambda c: f"{c.name}")
def test_parsing_the_wire_form_gives_the_command_back(command):
    wire = to_wire(command, "m1")
    assert wire["cmd"] == command.name and wire["id"] == "m1"
    assert parse_command(wire) == command


def test_the_wire_form_is_protocol_v1():
    """What clients sent before the command classes existed is what they send now."""
    assert to_wire(PinLevel(3)) == {"cmd": "pin_level", "level": 3}
    assert to_wire(Inject(2048)) == {"cmd": "inject", "prompt_tokens": 2048}
    assert to_wire(Set({"decode_bs_divisor": 12})) == {"cmd": "set", "decode_bs_divisor": 12}
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
        Set({"decode_bs_divisor": 0})
    with pytest.raises(ControlError, match="nothing to set"):
        Set({})
    with pytest.raises(ControlError, match="level"):
        PinLevel(True)
