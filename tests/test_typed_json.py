"""decode_as: any dataclass from parsed JSON, checked against its type hints, with one-line errors that
name the field (`field` and `reason` apart, for a refusal to name the same field); the kept keys of a
`FLAT` field, the left-out ones of an `ABSENT` field."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.description import DeviceDescription, EngineConfig
from pdtop.engine.records import RequestRecord
from pdtop.telemetry.decode import EventError, decode_event
from pdtop.telemetry.encode import plain
from pdtop.telemetry.events import Disagg
from pdtop.typed_json import DecodeError, check_fields, decode_as, decode_field


@pytest.fixture(scope="module")
def config() -> EngineConfig:
    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b")
    try:
        return engine.config_record()
    finally:
        engine.close()


def test_a_real_configuration_through_json_and_back(config):
    obj = json.loads(json.dumps(plain(config)))
    assert decode_as(EngineConfig, obj) == config  # pairs back to tuples, absent IF_SET keys back to None


@pytest.mark.parametrize("change, message, field, reason", [
    (lambda c: c.pop("policy"), "EngineConfig.policy: missing", "policy", "missing"),  # a field without a default
    (lambda c: c.update(decode_bs_divisor="36"), "EngineConfig.decode_bs_divisor: expected an integer, got '36'",
     "decode_bs_divisor", "expected an integer, got '36'"),
    (lambda c: c["levels"][2].append(1), "EngineConfig.levels[2]: expected a list of 2, got a list",
     "levels[2]", "expected a list of 2, got a list"),
    (lambda c: c.update(workload_rate=float("inf")), "EngineConfig.workload_rate: not a finite number: inf",
     "workload_rate", "not a finite number: inf"),
    (lambda c: c.update(workload_paused=0), "EngineConfig.workload_paused: expected true or false, got 0",
     "workload_paused", "expected true or false, got 0"),
])
def test_each_refusal_is_one_line_naming_the_field(config, change, message, field, reason):
    obj = plain(config)
    change(obj)
    with pytest.raises(DecodeError) as refused:
        decode_as(EngineConfig, obj)
    assert (str(refused.value), refused.value.field, refused.value.reason) == (message, field, reason)


def test_the_name_that_starts_the_line_and_what_is_not_an_object(config):
    with pytest.raises(DecodeError, match=r"^set: expected an object, got a list$"):
        decode_as(EngineConfig, [1], "set")
    with pytest.raises(DecodeError, match=r"^the config\.chunk_size: expected an integer, got null$"):
        decode_as(EngineConfig, {**plain(config), "chunk_size": None}, "the config")
    with pytest.raises(TypeError, match="takes a dataclass"):
        decode_as(dict, {})


def test_flat_keeps_the_keys_the_class_does_not_name_and_absent_records_the_left_out():
    device = decode_as(DeviceDescription, {"name": "sim:H100", "kind": "sim", "unit_name": "SMs", "units": 132,
                                           "cc": "9.0", "s_sat": 66})
    assert device.peak_bw is None and device.extra == {"cc": "9.0", "s_sat": 66}
    disagg = decode_as(Disagg, {"prefill_bootstrap_queue": 3.0, "kv_transfer_mb": None, "transfer_metrics": None})
    assert disagg.kv_transfer_mb is None and "kv_transfer_mb" not in disagg.absent  # null: on the page, not known
    assert disagg.decode_prealloc_queue is None and "decode_prealloc_queue" in disagg.absent  # not on the page
    assert plain(disagg) == {"prefill_bootstrap_queue": 3.0, "kv_transfer_mb": None, "transfer_metrics": None}


@dataclass(frozen=True)
class Knobs:
    """A closed class as a command is: its fields given or left out, nothing else."""

    size: int
    rate: float | None = None
    rows: list[list[int]] = field(default_factory=list)
    label: str | None = "x"


def test_a_left_out_field_takes_its_default_else_null_where_allowed_else_is_missing():
    """The defaults rule: what an older writer left out reads as its class says (a field added with a
    default), as for the pdmux YAML; a field without a default must be there unless null is allowed."""
    assert decode_as(Knobs, {"size": 3}) == Knobs(3, None, [], "x")
    with pytest.raises(DecodeError) as refused:
        decode_as(Knobs, {"rate": 1})
    assert (str(refused.value), refused.value.field) == ("Knobs.size: missing", "size")
    record = decode_as(RequestRecord, {"kind": "arrival", "request_id": 1, "time": 0.5, "prompt_tokens": 9})
    assert (record.output_tokens, record.itls_s, record.source) == (0, [], None)  # source: null before it existed


def test_a_hellos_version_is_never_filled_in_by_the_reader():
    """`Hello.pdtop` defaults to the writer's version: a hello without it is not read as this pdtop's own."""
    hello = {"type": "hello", "v": 1, "client_id": "c", "readonly": True, "engine": None, "scrape": None,
             "fleet": {"interval_s": 1.0, "window_s": 30.0, "router": None}}
    assert decode_event({**hello, "pdtop": "0.0.9"}).pdtop == "0.0.9"
    with pytest.raises(EventError, match=r"^hello\.pdtop: missing$"):
        decode_event(hello)


def test_a_closed_class_refuses_unknown_fields_and_nulls_for_none():
    assert decode_as(Knobs, {"size": 1, "rate": 2}, closed=True) == Knobs(1, 2.0)
    known = "unknown field; known: size, rate, rows, label"
    for obj, message in [({"size": 1, "sizes": 2}, f"k.sizes: {known}"),
                         ({"size": 1, "rate": None}, "k.rate: expected a number, got null"),
                         ({"size": 1, "\x1b[2J": 1}, f"k.'\\x1b[2J': {known}"),  # a terminal escape made visible
                         ({"size": 1, "y" * 5000: 1}, "k.'" + "y" * 36 + f"...: {known}")]:
        with pytest.raises(DecodeError) as refused:
            decode_as(Knobs, obj, "k", closed=True)
        assert str(refused.value) == message
    assert decode_as(Knobs, {"size": 1, "label": None}, closed=True).label is None  # its default is not None
    assert decode_as(Knobs, {"size": 1, "sizes": 2}) == Knobs(1)  # open: ignored


def test_one_field_and_an_instance_made_in_process_are_checked_as_decoded():
    assert decode_field(Knobs, "rate", 2) == 2.0
    with pytest.raises(DecodeError) as refused:
        decode_field(Knobs, "rows", [[1, True]])
    assert (str(refused.value), refused.value.field) == ("Knobs.rows[0][1]: expected an integer, got true",
                                                         "rows[0][1]")
    made = Knobs(4, 1, ((1, 2, 3),))  # type: ignore[arg-type]
    check_fields(made)
    assert (made.rate, made.rows) == (1.0, [[1, 2, 3]])
    with pytest.raises(DecodeError, match=r"^Knobs\.size: expected an integer, got true$"):
        check_fields(Knobs(True))


def test_a_value_in_an_error_is_shown_short():
    """Whatever was received, the line names it in at most 40 characters (a list or object by its kind)."""
    with pytest.raises(DecodeError) as refused:
        decode_as(Knobs, {"size": "z" * 10**6})
    assert len(str(refused.value)) < 100
    nested: list = []
    for _ in range(5):
        nested = [nested] * 10
    with pytest.raises(DecodeError, match=r"^Knobs\.size: expected an integer, got a list$"):
        decode_as(Knobs, {"size": nested})

