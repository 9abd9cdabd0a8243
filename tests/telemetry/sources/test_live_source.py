"""LiveSource against a real server: hello first, control with replies and refusals,
read-only, reconnect after the server comes back, close."""
from __future__ import annotations

import asyncio

import pytest

from pdtop.engine.scheduling.commands import AutoLevel, PinLevel, Set
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Reply
from pdtop.telemetry.server.server import TelemetryServer
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.source import ControlRefused, Source

from ..conftest import Pump, stepping, steps


async def next_of(pump: Pump, kind: str) -> dict:
    while True:
        e = await pump.get()
        if e["type"] == kind:
            return e


async def test_stream_and_control(engine, server):
    src = LiveSource(server.url)
    assert isinstance(src, Source) and src.state == "connecting" and not src.readonly
    pump = Pump(src)
    hello = await pump.get()
    assert hello["type"] == "hello" and src.state == "live" and src.hello == decode_event(hello)
    await steps(engine, 40)
    rounds = [(await next_of(pump, "round"))["index"] for _ in range(40)]
    assert rounds == list(range(40))  # batch frames come out one event at a time
    reply = await stepping(engine, src.send(Set(decode_bs_divisor=18)))  # once applied
    assert isinstance(reply, Reply) and reply.ok is True and reply.error is None
    assert reply.change == {"decode_bs_divisor": {"old": 36, "new": 18}}
    with pytest.raises(ControlRefused) as refused:
        await stepping(engine, src.send(PinLevel(1000)))
    assert refused.value.field == "level" and "0.." in refused.value.reason
    await steps(engine, 1)
    config = await next_of(pump, "config")
    assert config["config"]["decode_bs_divisor"] == 18 and config["client"] == hello["client_id"]
    await src.close()
    await asyncio.wait_for(pump.task, 5)
    assert src.state == "closed"


async def test_readonly_sources_refuse_locally(engine):
    server = TelemetryServer(engine, port=0, tick=0.01, token="tok")
    await server.start()
    try:
        for src in (LiveSource(server.url), LiveSource(server.url, token="tok", readonly=True)):
            pump = Pump(src)
            assert (await pump.get())["type"] == "hello"
            assert src.readonly
            with pytest.raises(ControlRefused, match="read-only"):
                await src.send(AutoLevel())
            await src.close()
        src = LiveSource(server.url, token="tok")
        pump = Pump(src)
        assert (await pump.get())["readonly"] is False
        assert (await stepping(engine, src.send(AutoLevel()))).ok
        await src.close()
    finally:
        await server.stop()


async def test_not_connected_refuses_and_bad_urls_are_rejected():
    with pytest.raises(ValueError, match="not a websocket URL"):
        LiveSource("http://127.0.0.1:1")
    src = LiveSource("ws://127.0.0.1:9")
    with pytest.raises(ControlRefused, match="not connected"):
        await src.send(AutoLevel())


async def test_reconnects_when_the_server_comes_back(engine):
    server = TelemetryServer(engine, port=0, tick=0.01)
    await server.start()
    port = server.port
    src = LiveSource(server.url)
    pump = Pump(src)
    first = await pump.get()
    await server.stop()
    while src.state == "live":
        await asyncio.sleep(0.01)
    assert src.state == "reconnecting"
    with pytest.raises(ControlRefused):
        await src.send(AutoLevel())
    server = TelemetryServer(engine, port=port, tick=0.01)
    await server.start()
    try:
        second = await next_of(pump, "hello")
        assert src.state == "live" and src.connections == 2
        assert second is not first and second["engine"] == first["engine"]
        assert (await stepping(engine, src.send(AutoLevel()))).ok
    finally:
        await src.close()
        await server.stop()
