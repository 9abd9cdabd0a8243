"""Control over the websocket: fuzzed input changes nothing and gets error replies, a
valid change is applied and announced to every client, the token gates control."""
from __future__ import annotations

import json
import random

import pytest

from pdtop.telemetry import encode
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.server.server import TelemetryServer

from ..conftest import Raw, steps

BAD_MESSAGES = [
    {"cmd": "launch_missiles"},
    {"cmd": ""},
    {"cmd": 7},
    {"cmd": None},
    {"no_cmd": 1},
    {"cmd": "pin_level"},
    {"cmd": "pin_level", "level": 99},
    {"cmd": "pin_level", "level": -1},
    {"cmd": "pin_level", "level": "3"},
    {"cmd": "pin_level", "level": 3.5},
    {"cmd": "pin_level", "level": True},
    {"cmd": "pin_level", "level": 2, "extra": 1},
    {"cmd": "set"},
    {"cmd": "set", "decode_bs_divisor": 0},
    {"cmd": "set", "decode_bs_divisor": -4},
    {"cmd": "set", "decode_bs_divisor": "24"},
    {"cmd": "set", "policy": "fastest"},
    {"cmd": "set", "workload_rate": -1},
    {"cmd": "set", "workload_rate": 1e9},
    {"cmd": "set", "split_forward_token_budget": 0},
    {"cmd": "set", "manual_divisions": "lots"},
    {"cmd": "set", "manual_divisions": [[1, 2]]},
    {"cmd": "set", "nonsense_knob": 1},
    {"cmd": "inject", "prompt_tokens": 0},
    {"cmd": "inject", "prompt_tokens": 10**9},
    {"cmd": "record_start"},
    {"cmd": "record_start", "path": 5},
    {"cmd": "record_start", "path": "/nonexistent-dir/x/y.ndjson"},
    {"cmd": "record_stop"},
]

BAD_FRAMES = [
    "", "   ", "not json", "{", "[1, 2, 3]", "42", '"set"', "null", "true",
    '{"cmd": "set", "decode_bs_divisor": NaN}', '{"cmd": "set", "workload_rate": Infinity}',
    '{"cmd": "auto_level", "id": {"nested": 1}}',
    b"\x00\x01binary", b'{"cmd": "auto_level"}',
    json.dumps({"cmd": "auto_level", "pad": "x" * 200_000}),
]


def _random_frames(n: int) -> list:
    rng = random.Random(5)
    out = []
    for _ in range(n):
        k = rng.randrange(4)
        if k == 0:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
        elif k == 1:
            out.append("".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 64))))
        elif k == 2:
            out.append(json.dumps({"cmd": rng.choice(["set", "pin_level", "inject", "x"]),
                                   rng.choice(["level", "decode_bs_divisor", "chunk_size", "policy", "id2"]):
                                   rng.choice([None, -1, 0, 10**12, "x", [], {}, 1.5, True])}))
        else:
            out.append(json.dumps([rng.random() for _ in range(rng.randrange(5))]))
    return out


async def test_fuzzed_control_gets_error_replies_and_changes_nothing(engine, server):
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    await steps(engine, 20)
    before = engine.config_record()
    for i, msg in enumerate(BAD_MESSAGES):  # a level or a prompt out of range is the engine's to refuse
        reply = await client.request({**msg, "id": i}, engine=engine)
        assert reply["ok"] is False, msg
        assert reply["id"] == i
        assert isinstance(reply["error"]["reason"], str) and reply["error"]["reason"]
    for frame in BAD_FRAMES + _random_frames(120):
        reply = await client.request(frame)
        assert reply["ok"] is False, frame
    await steps(engine, 20)  # a wrongly accepted change would be applied here
    assert engine.config_record() == before
    assert not client.of("config")
    # the server is still serving the same connection
    n = len(client.of("round"))
    await steps(engine, 10)
    await client.wait(lambda c: len(c.of("round")) >= n + 10)
    reply = await client.request({"cmd": "set", "decode_bs_divisor": 0, "id": "x"})
    assert reply == {"type": "reply", "v": 1, "id": "x", "ok": False,
                     "error": {"field": "decode_bs_divisor", "reason": reply["error"]["reason"]}}
    big = await client.request(json.dumps({"cmd": "auto_level", "pad": "x" * 200_000}))
    assert "too large" in big["error"]["reason"]
    await client.close()


async def test_a_valid_change_is_applied_and_announced_to_every_client(engine, server):
    a, b = await Raw.open(server.url), await Raw.open(server.url + "/?batch=1")
    await a.wait(lambda c: c.events)
    await b.wait(lambda c: c.events)
    reply = await a.request({"cmd": "set", "decode_bs_divisor": 24, "id": 7}, engine=engine)
    assert reply == {"type": "reply", "v": 1, "id": 7, "ok": True,  # once applied, at a round boundary
                     "change": {"decode_bs_divisor": {"old": 36, "new": 24}}}
    assert engine.config_record().decode_bs_divisor == 24
    await steps(engine, 2)
    for c in (a, b):
        await c.wait(lambda c: c.of("config"))
        (config,) = c.of("config")
        assert config["changes"] == {"decode_bs_divisor": {"old": 36, "new": 24}}
        assert config["client"] == a.events[0]["client_id"]
        assert config["config"] == encode.plain(engine.config_record())
    reply = await b.request({"cmd": "pin_level", "level": 3}, engine=engine)
    assert reply["ok"] and reply["id"] is None and reply["change"] == {"pinned_level": {"old": None, "new": 3}}
    await steps(engine, 2)
    await a.wait(lambda c: len(c.of("config")) == 2)
    assert a.of("config")[1]["config"]["pinned_level"] == 3
    n = len(a.of("round"))
    await steps(engine, 3)
    await a.wait(lambda c: len(c.of("round")) >= n + 3)
    assert all(r["pinned"] and r["level"] == 3 for r in a.of("round")[n:])
    await a.close()
    await b.close()


async def test_control_needs_the_token_when_one_is_set(engine):
    server = TelemetryServer(engine, port=0, tick=0.01, token="s3cret")
    await server.start()
    try:
        anon = await Raw.open(server.url)
        wrong = await Raw.open(server.url + "/?token=guess")
        good = await Raw.open(server.url + "/?token=s3cret")
        late = await Raw.open(server.url)
        for c in (anon, wrong, good, late):
            await c.wait(lambda c: c.events)
        assert anon.events[0]["readonly"] is True and good.events[0]["readonly"] is False
        assert wrong.events[0]["readonly"] is True
        await wrong.wait(lambda c: c.of("error"))
        assert wrong.of("error")[0]["field"] == "token"
        before = engine.config_record()
        for c in (anon, wrong):
            for msg in ({"cmd": "set", "decode_bs_divisor": 24}, {"cmd": "record_start", "path": "x.ndjson"}):
                reply = await c.request(msg)
                assert reply["ok"] is False and reply["error"]["field"] == "token"
        assert (await anon.request({"cmd": "auth", "token": "nope"}))["ok"] is False
        await steps(engine, 3)
        assert engine.config_record() == before and server.recorder is None
        # the token as the first message upgrades the connection
        assert (await late.request({"cmd": "auth", "token": "s3cret"}))["ok"] is True
        assert (await late.request({"cmd": "auto_level"}, engine=engine))["ok"] is True
        assert (await good.request({"cmd": "set", "decode_bs_divisor": 12}, engine=engine))["ok"] is True
        await steps(engine, 2)
        assert engine.config_record().decode_bs_divisor == 12
        await anon.wait(lambda c: c.of("config"))  # read-only clients still see changes
        for c in (anon, wrong, good, late):
            await c.close()
    finally:
        await server.stop()


def test_a_public_address_needs_a_token(engine):
    with pytest.raises(ValueError, match="needs --token"):
        TelemetryServer(engine, host="0.0.0.0", port=0)
    TelemetryServer(engine, host="0.0.0.0", port=0, token="t")  # allowed with one
    TelemetryServer(engine, host="::1", port=0)  # loopback


async def test_record_start_and_stop_over_the_wire(engine, tmp_path):
    async with TelemetryServer(engine, port=0, tick=0.01, record_dir=tmp_path) as server:
        client = await Raw.open(server.url)
        await client.wait(lambda c: c.events)
        path = tmp_path / "wire.ndjson.gz"
        reply = await client.request({"cmd": "record_start", "path": "wire.ndjson.gz", "id": 1})
        assert reply["ok"] and reply["path"] == str(path)
        again = await client.request({"cmd": "record_start", "path": str(path)})
        assert again["ok"] is False and "already recording" in again["error"]["reason"]
        await steps(engine, 30)
        await client.wait(lambda c: len(c.of("round")) >= 30)
        assert (await client.request({"cmd": "record_stop"}))["ok"]
        rec = read_recording(path)
        assert rec.hello["type"] == "hello" and rec.hello["engine"]["device"]["name"] == "sim:H100"
        assert [e["index"] for _, e in rec if e["type"] == "round"] == list(range(30))
        await client.close()
