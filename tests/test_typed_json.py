"""decode_as: any dataclass from parsed JSON, checked against its type hints, with one-line errors that
name the field (`field` and `reason` apart, for a refusal to name the same field); the kept keys of a
`FLAT` field, the left-out ones of an `ABSENT` field."""
from __future__ import annotations

import json

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.description import DeviceDescription, EngineConfig
from pdtop.telemetry.encode import plain
from pdtop.telemetry.events import Disagg
from pdtop.typed_json import DecodeError, decode_as


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
    (lambda c: c.pop("policy"), "EngineConfig: missing field 'policy'", None, "missing field 'policy'"),
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
