"""decode_event: what a real engine and server send decodes to the classes, with the same
values; anything else is refused with one line naming the field."""
from __future__ import annotations

import dataclasses
import json

import pytest

from pdtop.engine.description import IF_SET, DeviceDescription, EngineConfig, EngineDescription
from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.engine.scheduling import pdmux_config
from pdtop.engine.scheduling.commands import Inject, Set
from pdtop.telemetry import encode
from pdtop.telemetry.decode import EventError, UnknownEventType, decode_event
from pdtop.telemetry.events import (
    Batch,
    ConfigEvent,
    Dropped,
    ErrorNotice,
    Hello,
    Hw,
    Reply,
    ReplyError,
    Seek,
)
from pdtop.telemetry.hardware.hw import HwSampler

from .conftest import make_engine


def wire(event) -> dict:
    """Through JSON text, as a client gets it."""
    return json.loads(encode.encode(event))


@pytest.fixture(scope="module")
def stream():
    """A sim engine's hello and every record of 1500 rounds (with a config change and a long prompt)."""
    engine = make_engine(rate=20.0)
    records: list = []
    engine.add_sink(records.append)
    for i in range(1500):
        if i == 500:
            engine.control(Set(decode_bs_divisor=12), client="c1")
        if i == 700:
            engine.control(Inject(16384))
        engine.step()
    yield engine.describe(), engine.config_record(), records
    engine.close()


def test_a_real_engine_stream_decodes_to_its_own_records(stream):
    _, config, records = stream
    assert {type(r) for r in records} == {RoundRecord, RequestRecord, ConfigChange}
    assert [r.client for r in records if isinstance(r, ConfigChange)] == ["c1", None]
    assert any(r.prefills for r in records if isinstance(r, RoundRecord))
    for rec in records:
        if isinstance(rec, ConfigChange):
            got = decode_event(wire(ConfigEvent.after(rec, config)))
            assert isinstance(got, ConfigEvent) and got.changes == rec.changes and got.client == rec.client
            assert got.round_index == rec.round_index and got.config == config
        else:
            assert decode_event(json.loads(encode.encode_record(rec))) == rec  # every field, prefills too


def test_records_encode_the_same_without_orjson(stream, monkeypatch):
    """Where orjson is missing (the lent GPU machine), records take `encode`'s path: the same events."""
    records = [r for r in stream[2] if not isinstance(r, ConfigChange)]
    fast = [json.loads(encode.encode_record(r)) for r in records]
    monkeypatch.setattr(encode, "_dumps", None)
    assert [json.loads(encode.encode_record(r)) for r in records] == fast


def test_the_hello_is_the_engines_description(stream):
    describe = stream[0]
    hello = decode_event(wire(Hello(client_id="c3", readonly=True, engine=describe)))
    assert isinstance(hello, Hello) and hello.client_id == "c3" and hello.readonly
    engine = hello.engine
    assert engine.device == DeviceDescription("sim:H100", "sim", "SMs", 132, 3.35e12,
                                              {"cc": "9.0", "peak_flops": 989e12, "s_sat": 66})
    assert engine.levels == describe.levels == engine.config.levels
    assert engine.config.decode_bs_divisor == 12 and engine.config.pinned_level is None
    assert engine == describe  # the whole description, through JSON and back


def test_the_classes_hold_what_the_engine_describes(stream):
    """Both ways: the objects on the wire have exactly the classes' keys (a device adds its own facts)."""
    describe, config, _ = stream
    engine = wire(Hello(client_id="c3", readonly=True, engine=describe))["engine"]
    assert {f.name for f in dataclasses.fields(EngineDescription)} == set(engine)
    unset = {f.name for f in dataclasses.fields(EngineConfig)  # a key only when set: absent from the default
             if f.metadata == IF_SET and getattr(config, f.name) is None}
    assert {f.name for f in dataclasses.fields(EngineConfig)} - unset == set(engine["config"]) == set(
        encode.plain(config))
    assert set(pdmux_config.FIELDS) - unset <= set(engine["config"])  # a knob added to PdmuxConfig is in it
    named = {f.name for f in dataclasses.fields(DeviceDescription)} - {"extra"}
    assert set(engine["device"]) == named | set(describe.device.extra)


def test_what_the_server_builds_decodes():
    assert decode_event(wire(Dropped(3))) == Dropped(3)
    assert decode_event(wire(ErrorNotice("path", "disk full"))) == ErrorNotice("path", "disk full")
    assert decode_event(wire(encode.reply_event("m1", False, "level", "too big"))) == Reply(
        "m1", False, ReplyError("level", "too big"))
    assert decode_event(wire(encode.reply_event(7, True, path="run.ndjson"))) == Reply(7, True, path="run.ndjson")
    assert decode_event(wire(encode.reply_event(None, True, readonly=False))) == Reply(None, True, readonly=False)
    config = make_engine().config_record()
    seek = decode_event(wire(Seek(2.5, config)))
    assert isinstance(seek, Seek) and seek.position == 2.5 and seek.config == config
    assert decode_event(wire(Seek(2.5, None))) == Seek(2.5, None)  # a recording of a scraped page
    batch = decode_event({"type": "batch", "v": 1, "events": [{"type": "dropped", "v": 1, "count": 1}, {"x": 1}]})
    assert batch == Batch([{"type": "dropped", "v": 1, "count": 1}, {"x": 1}])  # inner events: decoded one by one


def test_a_real_hardware_sample_decodes():
    sample = HwSampler(lambda e: None).sample()
    hw = decode_event(wire(sample))
    assert isinstance(hw, Hw) and len(hw.cpu_percent) >= 1 and hw.host_mem_total_bytes > 0
    assert hw == sample  # GPU figures: numbers, "n/a", or absent (None) without a GPU sampler


@pytest.fixture
def round_event(stream):
    rec = next(r for r in stream[2] if isinstance(r, RoundRecord) and r.prefills)
    return json.loads(encode.encode_record(rec))


@pytest.mark.parametrize("change, message", [
    (lambda e: e.pop("level"), "round.level: missing"),
    (lambda e: e.update(level=True), "round.level: expected an integer, got true"),
    (lambda e: e.update(level=4.0), "round.level: expected an integer, got 4.0"),
    (lambda e: e.update(waiting="3"), "round.waiting: expected an integer, got '3'"),
    (lambda e: e.update(decode_step_s=float("nan")), "round.decode_step_s: not a finite number: nan"),
    (lambda e: e.update(bytes_moved=float("inf")), "round.bytes_moved: not a finite number: inf"),
    (lambda e: e.update(decode_step_s=None), "round.decode_step_s: expected a number, got null"),
    (lambda e: e["prefills"][0]["request_ids"].insert(0, "7"), "round.prefills[0].request_ids[0]: expected an integer"),
    (lambda e: e["prefills"][0].pop("tokens"), "round.prefills[0].tokens: missing"),
    (lambda e: e.update(prefills={}), "round.prefills: expected a list, got an object"),
    (lambda e: e.update(v=2), "round: protocol version 2; this pdtop reads version 1"),
    (lambda e: e.pop("v"), "round: protocol version null"),
])
def test_invalid_fields_are_named(round_event, change, message):
    change(round_event)
    with pytest.raises(EventError) as refused:
        decode_event(round_event)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_unknown_types_and_fields_and_non_events():
    with pytest.raises(UnknownEventType, match="unknown event type 'from_the_future'"):
        decode_event({"type": "from_the_future", "v": 9})
    assert decode_event({"type": "dropped", "v": 1, "count": 2, "new_field": [1]}) == Dropped(2)  # ignored
    assert decode_event({"type": "error", "v": 1, "reason": "x"}) == ErrorNotice(None, "x")  # nullable: may be absent
    for obj, message in (([1], "not a list"), ({"v": 1}, "string 'type', got null"), ("round", "not 'round'")):
        with pytest.raises(EventError, match=message):
            decode_event(obj)
    hello = {"type": "hello", "v": 1, "pdtop": "0.1.0", "client_id": "c1", "readonly": False, "engine": {}}
    with pytest.raises(EventError, match=r"^hello\.engine\.model: missing$"):
        decode_event(hello)
