"""The engine's description and configuration on the wire: what a real sim engine's `hello`,
`config` and `seek` carry since the engine hands over typed records (`pdtop.engine.description`)
is what it sent when `describe()` and `config_dict()` built dicts, and what docs/protocol.md
documents, key by key and type by type."""
from __future__ import annotations

import json

import pytest

from pdtop import __version__
from pdtop.engine.build import build_engine
from pdtop.engine.description import DeviceDescription
from pdtop.engine.devices.cpu import CpuDevice
from pdtop.engine.records import ConfigChange
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry import encode
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import ConfigEvent, Hello, Seek
from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.replay import ReplaySource

from .conftest import Pump
from .test_protocol_doc import DOC, doc_tables

# Written by the engine before the typed records (describe() and config_dict() returning dicts), for
# the engine below: `sim:H100`, synthetic qwen3-8b, 50 req/s seed 1, nothing run yet. A value changed
# on purpose (a spec, a default cap) means capturing these again.
CONFIG_BEFORE = (
    '{"sm_group_num":8,"manual_divisions":[],"split_forward_token_budget":65536,"decode_bs_divisor":36,'
    '"chunk_size":512,"policy":"pdmux","pinned_level":null,'
    '"levels":[[132,0],[112,20],[104,28],[96,36],[88,44],[80,52],[72,60],[0,132]],'
    '"workload_rate":50.0,"workload_paused":false}')
HELLO_BEFORE = (
    '{"type":"hello","v":1,"pdtop":"VERSION","client_id":"c1","readonly":false,'
    '"engine":{"model":"synthetic:qwen3-8b","num_layers":36,"max_context":40960,'
    '"device":{"name":"sim:H100","kind":"sim","unit_name":"SMs","units":132,"cc":"9.0","peak_bw":3350000000000.0,'
    '"peak_flops":989000000000000.0,"s_sat":66},'
    '"unit_name":"SMs","units":132,"virtual_clock":true,'
    '"levels":[[132,0],[112,20],[104,28],[96,36],[88,44],[80,52],[72,60],[0,132]],'
    '"config":CONFIG,"policy":"pdmux","runtime":{"kv_cache":{"tokens":1048576}},'
    '"limits":{"max_waiting_requests":1024,"max_waiting_tokens":262144,"refused":{"workload":0,"inject":0,"api":0}},'
    '"totals":{"arrived":0,"first_token":0,"finished":0,"rejected":0},'
    '"workload":"50 req/s Poisson (prompts 32-256, outputs 32-128 tokens); seed 1"},'
    '"api":"http://127.0.0.1:8000/v1"}').replace("VERSION", __version__).replace("CONFIG", CONFIG_BEFORE)
CONFIG_EVENT_BEFORE = ('{"type":"config","v":1,"time":1.5,"round_index":7,'
                       '"changes":{"decode_bs_divisor":{"old":36,"new":12}},"client":"c1","config":CONFIG}'
                       ).replace("CONFIG", CONFIG_BEFORE)
SEEK_BEFORE = '{"type":"seek","v":1,"position":2.5,"config":CONFIG}'.replace("CONFIG", CONFIG_BEFORE)
# Added on purpose since: pdtop's level rule and its SLO (null in a file written before them).
ADDED = ',"level_rule":"sglang","slo_itl_ms":null}'
ADDED_NULL = ',"level_rule":null,"slo_itl_ms":null}'


def now(before: str, added: str = ADDED) -> str:
    """An event text `before` with the configuration's keys added since."""
    return before.replace(CONFIG_BEFORE, CONFIG_BEFORE[:-1] + added)

# how docs/protocol.md's type column names a JSON value
_JSON_WORDS = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object",
               type(None): "null"}


@pytest.fixture(scope="module")
def engine():
    eng = build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=50.0, seed=1))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def texts(engine):
    """The hello, config and seek events the server and a replay write, as JSON text."""
    change = ConfigChange(1.5, 7, {"decode_bs_divisor": {"old": 36, "new": 12}}, "c1")
    return (encode.encode(Hello(client_id="c1", readonly=False, engine=engine.describe(),
                                api="http://127.0.0.1:8000/v1")),
            encode.encode(ConfigEvent.after(change, engine.config_record())),
            encode.encode(Seek(2.5, engine.config_record())))


def _canonical(text: str) -> str:
    """The same keys and values, whatever their order (an int stays an int: 132 is not 132.0)."""
    return json.dumps(json.loads(text), sort_keys=True)


def test_config_and_seek_are_byte_for_byte_what_the_dict_engine_sent(texts):
    _, config, seek = texts
    assert config == now(CONFIG_EVENT_BEFORE)
    assert seek == now(SEEK_BEFORE)


def test_the_hello_has_the_same_keys_and_values_and_only_peak_bw_moved(texts):
    hello = texts[0]
    assert _canonical(hello) == _canonical(now(HELLO_BEFORE))
    # The one difference in the text: `peak_bw`, a named field of the device, now comes before the
    # sim's own facts (it came after `cc`). JSON objects have no order, and nothing reads one.
    moved = now(HELLO_BEFORE).replace('"cc":"9.0","peak_bw":3350000000000.0,', '"peak_bw":3350000000000.0,"cc":"9.0",')
    assert hello == moved


def _types_match(value, words: frozenset[str]) -> bool:
    word = _JSON_WORDS[type(value)]
    return word in words or (word == "int" and "float" in words)  # JSON has one number: 3 is a float too


def _check_against_table(obj: dict, table: dict[str, frozenset[str]], where: str, extra=()):
    """Every key of `obj` is in the documented table (or documented in words: `extra`), every row of the
    table is a key of `obj` (here, where the engine fills each), and each value has the documented type."""
    assert set(obj) == set(table) | set(extra), where
    for key, words in table.items():
        assert _types_match(obj[key], words), f"{where}.{key}: {obj[key]!r} is not {sorted(words)}"


def test_a_real_sim_engines_hello_config_and_seek_match_the_documented_tables(texts):
    tables = doc_tables(DOC.read_text())
    hello, config, seek = (json.loads(t) for t in texts)
    envelope = {"type", "v"}
    # `scrape` and `fleet` (null from a pdtop server) were never written by one, and still are not: decoding
    # fills None
    assert "scrape" not in hello and "fleet" not in hello and decode_event(hello).scrape is None
    assert decode_event(hello).fleet is None
    # `recording` is the server's to say (a key only from servers that say): the engine's hello has none
    assert "recording" not in hello and decode_event(hello).recording is None
    _check_against_table(hello, {k: w for k, w in tables["hello"].items() if k not in ("scrape", "fleet", "recording")},
                         "hello", envelope)
    engine = hello["engine"]
    _check_against_table(engine, tables["hello.engine"], "hello.engine")
    # the prose under the device table names the sim's own facts: cc, peak_flops, s_sat
    _check_against_table(engine["device"], tables["hello.engine.device"], "hello.engine.device",
                         {"cc", "peak_flops", "s_sat"})
    # SGLang's newer knobs are keys only when on (test_config_writes_sglangs_newer_knobs_only_when_on)
    tables["hello.engine.config"] = {k: w for k, w in tables["hello.engine.config"].items() if k not in WHEN_ON}
    for name in ("limits", "totals", "config"):
        _check_against_table(engine[name], tables[f"hello.engine.{name}"], f"hello.engine.{name}")
    _check_against_table(config, tables["config"], "config", envelope)
    _check_against_table(config["config"], tables["hello.engine.config"], "config.config")
    # a seek made without counts writes none (a replay's has them: test_a_recording_written_before_...)
    _check_against_table(seek, {k: w for k, w in tables["seek"].items() if k not in ("totals", "dropped")}, "seek",
                         envelope)
    _check_against_table(seek["config"], tables["hello.engine.config"], "seek.config")


WHEN_ON = {"max_split_forward_layers": 3, "overlap_decode_full_sm": True, "chunked_prefill_size": 2048}


def test_config_writes_sglangs_newer_knobs_only_when_on():
    from pdtop.engine.build import build_engine
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

    config = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 0, 1]], max_split_forward_layers=3,
                         overlap_decode_full_sm=True, chunked_prefill_size=2048)
    for cfg, want in ((config, WHEN_ON), (PdmuxConfig(), {})):
        engine = build_engine("sim:H100", config=cfg)
        try:
            record = engine.config_record()
        finally:
            engine.close()
        written = json.loads(json.dumps(encode.plain(record)))
        assert {k: written[k] for k in WHEN_ON if k in written} == want
        back = decode_event({**json.loads(CONFIG_EVENT_BEFORE), "config": written})
        assert back.config == record
        assert (back.config.max_split_forward_layers or 0, bool(back.config.overlap_decode_full_sm),
                back.config.chunked_prefill_size or 0) == \
            (cfg.max_split_forward_layers, cfg.overlap_decode_full_sm, cfg.chunked_prefill_size)


def test_a_device_writes_its_own_facts_flat_and_no_peak_bw_it_does_not_know():
    dev = CpuDevice([(2, 0), (1, 1), (0, 2)], cores=[0, 1])
    try:
        described = dev.describe()
    finally:
        dev.close()
    assert described == DeviceDescription("cpu (2 cores)", "cpu", "cores", 2, None, {"cores": [0, 1]})
    text = json.dumps(encode.plain(described), separators=(",", ":"))
    assert text == '{"name":"cpu (2 cores)","kind":"cpu","unit_name":"cores","units":2,"cores":[0,1]}'  # as before


def test_a_device_description_reads_back_with_its_own_facts():
    """Decoding keeps what a device adds (any key the class does not name) in `extra`, unchecked;
    a recording from before the records (every one so far) reads back the same way."""
    hello = decode_event(json.loads(HELLO_BEFORE))
    assert isinstance(hello, Hello) and hello.engine is not None
    assert hello.engine.device == DeviceDescription("sim:H100", "sim", "SMs", 132, 3.35e12,
                                                    {"cc": "9.0", "peak_flops": 989e12, "s_sat": 66})
    cpu = {"type": "hello", "v": 1, "pdtop": "0", "client_id": "c1", "readonly": True,
           "engine": {**json.loads(HELLO_BEFORE)["engine"],
                      "device": {"name": "cpu (2 cores)", "kind": "cpu", "unit_name": "cores", "units": 2,
                                 "cores": [0, 1], "extra": "a key like any other"}}}
    device = decode_event(cpu).engine.device
    assert device.peak_bw is None and device.extra == {"cores": [0, 1], "extra": "a key like any other"}


def test_a_fact_named_like_a_field_is_refused_before_it_reaches_the_wire():
    with pytest.raises(ValueError, match=r"may not be named like its fields: \['units'\]"):
        DeviceDescription("sim:H100", "sim", "SMs", 132, extra={"units": 7})
    described = DeviceDescription("sim:H100", "sim", "SMs", 132)
    described.extra["units"] = 7  # added later: two values of one key
    with pytest.raises(ValueError, match=r"extra keys named like its fields: \['units'\]"):
        encode.plain(described)


async def test_a_recording_written_before_the_records_replays_and_seeks(tmp_path):
    """A file whose hello and config event are the dict-building engine's text replays as it was
    recorded, and a seek carries the configuration in force there, as the old seek did."""
    path = tmp_path / "before.ndjson"
    rec = Recorder(path, json.loads(HELLO_BEFORE))
    rec.write('{"type":"round","v":1,"index":0,"time":0.0}', t=0.0)
    changed = CONFIG_EVENT_BEFORE.replace('"decode_bs_divisor":36,"chunk_size"', '"decode_bs_divisor":12,"chunk_size"')
    rec.write(changed, t=1.5)
    rec.write('{"type":"round","v":1,"index":1,"time":2.5}', t=2.5)
    rec.close()
    src = ReplaySource(path)
    src.pause()
    src.lookback_s = 0.0  # the seek's own event, not the window before it
    events = Pump(src)
    assert await events.get() == json.loads(HELLO_BEFORE)
    src.seek(0.5)  # before the change: the hello's configuration
    seek = now(SEEK_BEFORE, ADDED_NULL)  # keys the file predates: null
    # and, since, the request counts and lost events as the window starts (none yet)
    counts = ',"totals":{"arrived":0,"first_token":0,"finished":0,"rejected":0},"dropped":0}'
    assert encode.encode(await events.get()) == seek.replace('"position":2.5', '"position":0.5')[:-1] + counts
    src.seek(2.0)  # after it: the config event's
    seek = await events.get()
    assert seek["config"] == json.loads(changed)["config"] | {"level_rule": None, "slo_itl_ms": None}
    assert seek["config"]["decode_bs_divisor"] == 12
    await src.close()
    await events.task
