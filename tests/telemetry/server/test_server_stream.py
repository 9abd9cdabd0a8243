"""The server's stream: hello first, every client gets the rounds, a client that never
reads only loses its own events (counted), overload is shed and counted."""
from __future__ import annotations

import asyncio
import importlib.util
import socket

import pytest
from websockets.asyncio.client import connect

from pdtop.telemetry import encode
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.server.server import TelemetryServer

from ..conftest import Raw, steps


def counted(client: Raw) -> int:
    """Events received plus events the server said were dropped."""
    stream = [e for e in client.events if e["type"] in ("round", "request", "config")]
    return len(stream) + sum(e["count"] for e in client.of("dropped"))


async def test_every_client_gets_hello_then_every_round(engine, server):
    plain = [await Raw.open(server.url) for _ in range(2)]
    batched = await Raw.open(server.url + "/?batch=1")
    clients = [*plain, batched]
    await asyncio.gather(*(c.wait(lambda c: c.events) for c in clients))
    for c in clients:
        hello = c.events[0]
        assert hello["type"] == "hello" and hello["v"] == 1 and hello["readonly"] is False
        assert hello["engine"]["device"]["name"] == "sim:H100" and hello["engine"]["units"] == 132
        assert hello["engine"]["config"] == encode.plain(engine.config_record())
    assert len({c.events[0]["client_id"] for c in clients}) == 3
    for _ in range(4):
        await steps(engine, 50)
    for c in clients:
        await c.wait(lambda c: len(c.of("round")) >= 200)
        assert [e["index"] for e in c.of("round")] == list(range(200))
        assert not c.of("dropped")
        r = c.of("round")[-1]
        assert r["v"] == 1 and isinstance(r["prefills"], list) and r["decode_units"] + r["prefill_units"] <= 132
    assert plain[0].of("request") == batched.of("request") != []
    for c in clients:
        await c.close()
    await asyncio.sleep(0.05)
    assert server.clients == {}


@pytest.mark.parametrize("query", ["", "/?batch=1"])
async def test_a_client_that_never_reads_does_not_hold_back_the_others(engine, query):
    produced = []
    engine.add_sink(produced.append)
    server = TelemetryServer(engine, port=0, tick=0.01, queue_size=256, max_event_rate=1e9)
    await server.start()
    try:
        reader = await Raw.open(server.url + query)
        # The stalled client: it never reads.
        sock = socket.create_connection(("127.0.0.1", server.port))
        stalled = await connect(server.url + query, sock=sock, compression=None, max_queue=1)
        await reader.wait(lambda c: c.events)
        # a slow link: a small socket buffer on the server's side
        server_side = [c for c in server.clients.values() if c.ws.remote_address[1] == sock.getsockname()[1]]
        server_sock = server_side[0].ws.transport.get_extra_info("socket")
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        rounds = 0
        for _ in range(20):  # bursts the reader can keep up with; the stalled client cannot
            await steps(engine, 50)
            rounds += 50
            await reader.wait(lambda c, n=rounds: len(c.of("round")) >= n)
        # the reader saw every round, in order, and lost nothing
        assert [e["index"] for e in reader.of("round")] == list(range(rounds))
        assert not reader.of("dropped")
        assert counted(reader) == len(produced)
        # now the stalled client reads: it lost events and was told how many
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)  # the link gets fast again
        got = Raw(stalled)
        await got.wait(lambda c: counted(c) >= len(produced))
        assert got.events[0]["type"] == "hello"
        assert sum(e["count"] for e in got.of("dropped")) > 0
        assert counted(got) == len(produced)
        assert len(got.of("round")) < rounds
        await got.close()
        await reader.close()
    finally:
        await server.stop()


async def test_overload_is_shed_and_counted(engine):
    produced = []
    engine.add_sink(produced.append)
    server = TelemetryServer(engine, port=0, tick=0.01, max_event_rate=200)
    await server.start()
    try:
        client = await Raw.open(server.url + "/?batch=1")
        await client.wait(lambda c: c.events)
        await steps(engine, 3000)  # far more than 200 events/s arrive at once
        await client.wait(lambda c: counted(c) >= len(produced))
        assert counted(client) == len(produced)
        assert server.events_shed > 0 and sum(e["count"] for e in client.of("dropped")) >= server.events_shed
        indexes = [e["index"] for e in client.of("round")]
        assert indexes == sorted(set(indexes)) and 0 < len(indexes) < 3000
        await client.close()
    finally:
        await server.stop()


async def test_hw_events_and_published_events_reach_clients(engine, server):
    from pdtop.telemetry.hardware.hw import HwSampler

    client = await Raw.open(server.url)
    sampler = HwSampler(server.publish, interval=0.05).start()
    try:
        await client.wait(lambda c: len(c.of("hw")) >= 2)
    finally:
        sampler.stop()
    hw = client.of("hw")[-1]
    assert hw["v"] == 1 and hw["time"] > 1e9
    assert len(hw["cpu_percent"]) >= 1 and 0 < hw["host_mem_used_bytes"] < hw["host_mem_total_bytes"]
    nvml_module = importlib.util.find_spec("pdtop.telemetry.hardware.nvml_sampler") is not None
    if nvml_module and not sampler.gpu_available:  # no NVIDIA driver here: the GPU fields say so
        assert hw["gpu_util_pct"] == "n/a" and hw["gpu_reason"]
    await client.close()


async def test_with_nobody_listening_the_engine_carries_no_telemetry_sink(engine, server, tmp_path):
    """No client and no recording: the server takes its sink off the engine, so the rounds
    pay nothing for telemetry; a client or a recording puts it back and gets every round."""
    await asyncio.sleep(0.05)  # a few ticks
    assert engine.sinks.all == ()
    await steps(engine, 20)
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    assert len(engine.sinks.all) == 1
    await steps(engine, 30)
    await client.wait(lambda c: len(c.of("round")) >= 30)
    assert [e["index"] for e in client.of("round")] == list(range(20, 50))
    assert not client.of("dropped")  # what ran before it came is not its loss
    await client.close()
    await asyncio.sleep(0.05)
    assert engine.sinks.all == ()
    await steps(engine, 10)
    server.start_recording(str(tmp_path / "r.jsonl"), confined=False)
    assert len(engine.sinks.all) == 1
    await steps(engine, 10)
    await asyncio.sleep(0.05)
    path = server.stop_recording()
    rounds = [e["index"] for _, e in read_recording(path) if e["type"] == "round"]
    assert rounds == list(range(60, 70))
    await asyncio.sleep(0.05)
    assert engine.sinks.all == ()
