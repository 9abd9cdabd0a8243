"""Control messages checked once, against the state they meet when applied at a round boundary:
two valid messages on one connection never crash the engine or leave config and levels apart; a
change the state no longer allows is refused in its reply, and the engine goes on; `serve` reports
an engine that stopped in one line and exits 1."""
from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from pdtop.commands import serve
from pdtop.engine.errors import ControlError
from pdtop.engine.records import ConfigChange
from pdtop.engine.scheduling.commands import PinLevel
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.telemetry.server.commands import parse_command

from ..conftest import Raw, make_engine, queued, steps


async def test_pin_after_fewer_levels_is_refused_naming_the_field(engine, server):
    """The issue's crash: `set sm_group_num 3` then `pin_level 7`, both queued for one boundary."""
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    for msg in ({"cmd": "set", "sm_group_num": 3, "id": 1}, {"cmd": "pin_level", "level": 7, "id": 2}):
        await client.ws.send(json.dumps(msg))  # both sent before the boundary that applies them
    await queued(engine, 2)
    await steps(engine, 5)  # the boundary where both are applied, in order
    await client.wait(lambda c: len(c.of("reply")) == 2)
    first, second = client.of("reply")
    assert first["ok"] is True and first["change"]["sm_group_num"] == {"old": 8, "new": 3}
    assert second["ok"] is False and second["error"]["field"] == "level" and "0..2" in second["error"]["reason"]
    config = engine.config_record()
    assert config.sm_group_num == 3 and len(config.levels) == 3 and config.pinned_level is None
    assert (await client.request({"cmd": "pin_level", "level": 2}, engine=engine))["ok"] is True
    await steps(engine, 2)
    assert engine.config_record().pinned_level == 2
    await client.close()


async def test_levels_follow_manual_divisions_queued_before_sm_group_num(engine, server):
    """`manual_divisions` then `sm_group_num` on one connection: the levels are those of the
    configuration the engine ends with (the manual divisions), never the automatic ones."""
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    assert (await client.request({"cmd": "set", "manual_divisions": [[72, 60, 1]]}, engine=engine))["ok"]
    assert (await client.request({"cmd": "set", "sm_group_num": 5}, engine=engine))["ok"]
    await steps(engine, 3)
    config = engine.config_record()
    assert config.manual_divisions == [(72, 60, 1)]
    assert config.levels == [(132, 0), (72, 60), (0, 132)] == engine.describe().levels
    await client.wait(lambda c: c.of("config"))
    assert client.of("config")[-1]["config"]["levels"] == [[132, 0], [72, 60], [0, 132]]
    await client.close()


@pytest.mark.parametrize("first, second, field", [
    ({"cmd": "set", "sm_group_num": 3}, {"cmd": "pin_level", "level": 5}, "level"),
    ({"cmd": "set", "manual_divisions": [[100, 32, 0]]}, {"cmd": "pin_level", "level": 3}, "level"),
    ({"cmd": "set", "sm_group_num": 4}, {"cmd": "pin_level", "level": 4}, "level"),
])
def test_every_queued_change_is_checked_against_those_before_it(first, second, field):
    engine = make_engine()
    try:
        applied, pinned = engine.control(parse_command(first)), engine.control(parse_command(second))
        engine.step()  # both at one boundary, in order: the second meets the first's levels
        assert applied.result(0).changes
        with pytest.raises(ControlError) as refused:
            pinned.result(0)
        assert refused.value.field == field and engine.config_record().pinned_level is None
        for _ in range(3):
            engine.step()
    finally:
        engine.close()


def test_a_change_the_state_no_longer_allows_is_refused_not_fatal():
    """Checked against the state it meets: here the levels change under a queued pin (as a device or a
    future code path could do); the engine refuses it and keeps running rounds."""
    engine = make_engine()
    seen: list = []
    engine.add_sink(seen.append)
    try:
        pinned = engine.control(PinLevel(6), client="c9")
        fewer = PdmuxConfig(manual_divisions=[[112, 20, 0]])
        engine.scheduler.set_config(fewer, SplitTable.for_gpu(132, 9, fewer))
        rounds = [engine.step() for _ in range(5)]
        with pytest.raises(ControlError) as refused:
            pinned.result(0)
        assert refused.value.field == "level" and "0..2" in refused.value.reason
        assert not [r for r in seen if isinstance(r, ConfigChange)]  # nothing changed, nothing announced
        assert not any(r.pinned for r in rounds) and [r.index for r in rounds] == list(range(5))
    finally:
        engine.close()


async def test_a_refusal_at_the_boundary_reaches_its_client_in_the_reply(engine, server):
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    await client.ws.send(json.dumps({"cmd": "pin_level", "level": 6, "id": 1}))  # valid against 8 levels
    await queued(engine, 1)
    fewer = PdmuxConfig(manual_divisions=[[112, 20, 0]])
    engine.scheduler.set_config(fewer, SplitTable.for_gpu(132, 9, fewer))
    await steps(engine, 3)
    await client.wait(lambda c: c.of("reply"))
    (reply,) = client.of("reply")
    assert reply["ok"] is False and reply["error"]["field"] == "level" and "0..2" in reply["error"]["reason"]
    assert not client.of("error") and engine.config_record().pinned_level is None
    await client.close()


def test_serve_says_in_one_line_that_the_engine_stopped_and_exits_1(capsys):
    """The engine's thread fails (here its step raises after a few rounds): one line, exit 1."""
    engine = make_engine()
    real_step, calls = engine.step, [0]

    def failing_step():
        calls[0] += 1
        if calls[0] > 20:
            raise RuntimeError("device lost\nsecond line")
        return real_step()

    engine.step = failing_step
    args = argparse.Namespace(host="127.0.0.1", port=0, token=None, allow_origin=[], record_dir=None,
                              max_clients=4, record=None, api_port=None)
    try:
        code = asyncio.run(asyncio.wait_for(serve._serve(engine, args), 30))
    finally:
        engine.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == ["pdtop serve: error: the engine stopped: RuntimeError: device lost"]
