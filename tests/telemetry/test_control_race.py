"""Control messages validated against the state they will be applied to: two valid
messages on one connection never crash the engine or leave config and levels apart; a
change that fails when applied is reported, and the engine goes on; `serve` reports an
engine that stopped in one line and exits 1."""
from __future__ import annotations

import argparse
import asyncio

import pytest
from conftest import Raw, make_engine, steps

from pdtop.commands import serve
from pdtop.engine.errors import ControlError
from pdtop.engine.records import ControlFailure
from pdtop.engine.scheduling.commands import PinLevel, parse_command
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable


async def test_pin_after_fewer_levels_is_refused_naming_the_field(engine, server):
    """The issue's crash: `set sm_group_num 3` then `pin_level 7`, both queued for one boundary."""
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    first = await client.request({"cmd": "set", "sm_group_num": 3, "id": 1})
    second = await client.request({"cmd": "pin_level", "level": 7, "id": 2})
    assert first["ok"] is True
    assert second["ok"] is False and second["error"]["field"] == "level" and "0..2" in second["error"]["reason"]
    await steps(engine, 5)  # the boundary where both would have been applied
    config = engine.config_record()
    assert config.sm_group_num == 3 and len(config.levels) == 3 and config.pinned_level is None
    assert (await client.request({"cmd": "pin_level", "level": 2}))["ok"] is True
    await steps(engine, 2)
    assert engine.config_record().pinned_level == 2
    await client.close()


async def test_levels_follow_manual_divisions_queued_before_sm_group_num(engine, server):
    """`manual_divisions` then `sm_group_num` on one connection: the levels are those of the
    configuration the engine ends with (the manual divisions), never the automatic ones."""
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    assert (await client.request({"cmd": "set", "manual_divisions": [[72, 60, 1]]}))["ok"]
    assert (await client.request({"cmd": "set", "sm_group_num": 5}))["ok"]
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
        engine.control(parse_command(first))
        with pytest.raises(ControlError) as refused:
            engine.control(parse_command(second))
        assert refused.value.field == field
        for _ in range(3):
            engine.step()
    finally:
        engine.close()


def test_a_change_the_state_no_longer_allows_is_reported_not_fatal():
    """Checked again when applied: here the levels change under a queued pin (as a device or a
    future code path could do); the engine reports the refusal and keeps running rounds."""
    engine = make_engine()
    seen: list = []
    engine.add_sink(seen.append)
    try:
        engine.control(PinLevel(6), client="c9")
        fewer = PdmuxConfig(manual_divisions=[[112, 20, 0]])
        engine.scheduler.set_config(fewer, SplitTable.for_gpu(132, 9, fewer))
        rounds = [engine.step() for _ in range(5)]
        (failure,) = [r for r in seen if isinstance(r, ControlFailure)]
        assert failure.field == "level" and "0..2" in failure.reason and failure.client == "c9"
        assert not any(r.pinned for r in rounds) and [r.index for r in rounds] == list(range(5))
    finally:
        engine.close()


async def test_a_failure_at_apply_time_reaches_clients_as_an_error_event(engine, server):
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    assert (await client.request({"cmd": "pin_level", "level": 6}))["ok"]
    fewer = PdmuxConfig(manual_divisions=[[112, 20, 0]])
    engine.scheduler.set_config(fewer, SplitTable.for_gpu(132, 9, fewer))
    await steps(engine, 3)
    await client.wait(lambda c: c.of("error"))
    (error,) = client.of("error")
    assert error["field"] == "level" and error["reason"].startswith("not applied:")
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
