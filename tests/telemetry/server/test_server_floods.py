"""Floods from one client cost only that client: a burst of config changes leaves every
reading client connected, control is rate-limited per connection and wrong tokens per address, deep
nesting gets a normal reply and no traceback, repeated problems are logged once, a new
client is not told of events dropped before it connected, and out of file descriptors
the server refuses new connections quietly and keeps serving the others."""
from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import subprocess
import sys
import threading
import time

from websockets.asyncio.client import connect

from pdtop.engine.scheduling.commands import Set
from pdtop.telemetry import encode
from pdtop.telemetry.server.clients import CONTROL_BURST
from pdtop.telemetry.server.control_channel import MAX_WAITING
from pdtop.telemetry.server.server import TelemetryServer

from ..conftest import Raw, queued, steps


async def test_2000_config_changes_in_one_tick_leave_every_reading_client_connected(engine, server):
    clients = [await Raw.open(server.url), await Raw.open(server.url + "/?batch=1")]
    for c in clients:
        await c.wait(lambda c: c.events)
    for i in range(2000):  # as many clients' changes as the engine may apply at one boundary
        engine.control(Set(decode_bs_divisor=1 + i % 50, chunk_size=100 + i), client=f"c{i % 7}")
    await steps(engine, 3)
    for c in clients:
        await c.wait(lambda c: c.of("config"))
    await steps(engine, 20)
    for c in clients:
        await c.wait(lambda c: len(c.of("round")) >= 23)
        configs = c.of("config")  # one a tick, merged: each field's first old and last new
        assert 1 <= len(configs) <= 100
        olds = [e["changes"]["chunk_size"]["old"] for e in configs]
        news = [e["changes"]["chunk_size"]["new"] for e in configs]
        assert olds == [512, *news[:-1]] and news[-1] == 2099  # nothing lost between merged events
        assert all(e["client"] is None or e["client"].startswith("c") for e in configs)
        assert configs[-1]["config"] == encode.plain(engine.config_record())
        assert c.ws.close_code is None
    assert len(server.clients) == 2
    for c in clients:
        await c.close()


async def test_a_control_flood_is_refused_beyond_the_rate_and_costs_others_nothing(engine, server):
    flooder, other = await Raw.open(server.url), await Raw.open(server.url)
    for c in (flooder, other):
        await c.wait(lambda c: c.events)
    for i in range(1100):
        await flooder.ws.send(json.dumps({"cmd": "set", "chunk_size": 100 + i, "id": i}))

    async def all_replied():  # the boundaries that apply those accepted
        while len(flooder.of("reply")) < 1100:
            await steps(engine, 1)
            await asyncio.sleep(0.005)

    await asyncio.wait_for(all_replied(), 30)
    replies = flooder.of("reply")
    assert [r["id"] for r in replies] == list(range(1100))  # every message answered, in order
    refused = [r for r in replies if not r["ok"]]
    accepted = 1100 - len(refused)
    assert MAX_WAITING <= accepted <= CONTROL_BURST + 40  # at most 16 wait for one boundary
    over_rate = [r for r in refused if "too many control messages" in r["error"]["reason"]]
    assert 1100 - CONTROL_BURST - 40 <= len(over_rate) and all(r["error"]["field"] == "cmd" for r in refused)
    assert all("too many control messages" in r["error"]["reason"] or "too many commands waiting" in
               r["error"]["reason"] for r in refused)
    await steps(engine, 5)
    await other.wait(lambda c: len(c.of("round")) >= 5 and c.of("config"))
    configs = other.of("config")  # merged per tick: how many ticks the accepted burst spans depends on load
    assert 1 <= len(configs) <= accepted and configs[-1]["config"] == encode.plain(engine.config_record())
    assert other.ws.close_code is None and flooder.ws.close_code is None
    for c in (flooder, other):
        await c.close()


async def test_a_connection_has_at_most_16_commands_waiting_for_the_engine(engine, tmp_path):
    """Commands wait for the engine's next round boundary; a connection that sends more before it
    comes has the rest refused at once (each reply still in its message's order), changing nothing."""
    async with TelemetryServer(engine, port=0, tick=0.01, record_dir=tmp_path) as server:
        client = await Raw.open(server.url)
        await client.wait(lambda c: c.events)
        for i in range(MAX_WAITING + 4):  # within the rate's burst
            await client.ws.send(json.dumps({"cmd": "set", "chunk_size": 100 + i, "id": i}))
        await client.ws.send(json.dumps({"cmd": "record_start", "path": "after.ndjson", "id": "rec"}))
        await queued(engine, MAX_WAITING)

        async def recording():  # read after the 20: they have all been handled
            while server.recorder is None:
                await asyncio.sleep(0.002)

        await asyncio.wait_for(recording(), 5)
        assert not client.of("reply") and len(engine.controls) == MAX_WAITING  # the first waits: so do the rest
        await steps(engine, 1)
        await client.wait(lambda c: len(c.of("reply")) == MAX_WAITING + 5)
        replies = client.of("reply")
        assert [r["id"] for r in replies] == [*range(MAX_WAITING + 4), "rec"] and replies[-1]["ok"]
        assert all(r["ok"] and r["change"]["chunk_size"]["new"] == 100 + r["id"] for r in replies[:MAX_WAITING])
        assert all(not r["ok"] and r["error"]["field"] == "cmd" and "at most 16 on one connection" in
                   r["error"]["reason"] for r in replies[MAX_WAITING:-1])
        assert engine.config_record().chunk_size == 100 + MAX_WAITING - 1
        assert (await client.request({"cmd": "auto_level"}, engine=engine))["ok"] is True  # room again
        await client.close()


async def test_wrong_tokens_make_the_address_wait_across_reconnects(engine):
    """Guesses went at 523/s by reconnecting with `?token=`. After a few wrong tokens the address waits, and
    meanwhile a token it gives is not checked, in the URL or by `auth`, on any connection."""
    async with TelemetryServer(engine, port=0, tick=0.01, token="s3cret") as server:
        reasons = []
        for i in range(12):
            c = await Raw.open(server.url + f"/?token=guess{i}")
            await c.wait(lambda c: c.of("error"))
            assert c.events[0]["readonly"] is True
            reasons.append(c.of("error")[0]["reason"])
            await c.close()
        assert [r.startswith("wrong token") for r in reasons] == [True] * 5 + [False] * 7
        assert all("not checked" in r for r in reasons[5:])
        late = await Raw.open(server.url)
        await late.wait(lambda c: c.events)
        reply = await late.request({"cmd": "auth", "token": "s3cret"})  # the right one, but not yet
        assert reply["ok"] is False and "retry in 1 s" in reply["error"]["reason"]
        await asyncio.sleep(1.05)
        assert (await late.request({"cmd": "auth", "token": "s3cret"}))["ok"] is True
        other = await Raw.open(server.url)
        await other.wait(lambda c: c.events)
        assert (await other.request({"cmd": "auth", "token": "nope"}))["error"]["reason"] == "wrong token"
        for c in (late, other):
            await c.close()


async def test_deep_nesting_gets_a_normal_reply_and_no_log_flood(engine, server, caplog):
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    deep = '{"cmd": "set", "x": ' + "[" * 1100 + "]" * 1100 + "}"
    with caplog.at_level(logging.DEBUG, logger="pdtop"):
        replies = [await client.request(deep) for _ in range(30)]
    assert all(not r["ok"] and "nested too deeply" in r["error"]["reason"] for r in replies)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (await client.request({"cmd": "auto_level"}, engine=engine))["ok"] is True  # the connection still works
    await client.close()


async def test_a_new_client_is_not_told_of_events_dropped_before_it_connected(engine, server):
    """The engine runs at its own pace (as under `pdtop serve`); while nobody listens the server
    only counts its events. Those are no client's loss: no `dropped` on connecting."""
    stop = threading.Event()
    runner = threading.Thread(target=engine.run, args=(stop,))
    runner.start()
    try:
        for query in ("", "/?batch=1", "", "/?batch=1"):
            await asyncio.sleep(0.2)
            client = await Raw.open(server.url + query)
            await client.wait(lambda c: len(c.of("round")) >= 20)
            assert client.of("dropped") == []
            await client.close()
    finally:
        stop.set()
        await asyncio.to_thread(runner.join)


def test_out_of_file_descriptors_new_connections_wait_quietly_and_clients_are_served(tmp_path):
    """`pdtop serve` under a low open-file limit, then more connections than it allows."""
    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    err = (tmp_path / "stderr").open("w+")
    serve = subprocess.Popen([sys.executable, "-m", "pdtop", "serve", "--device", "sim:H100", "--port", "0"],
                             stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=low_fd_limit)
    socks: list[socket.socket] = []
    try:
        url = serve.stdout.readline().split()[-1]
        port = int(url.rsplit(":", 1)[1])

        async def watch() -> int:
            async with connect(url) as ws:
                await ws.recv()  # hello
                for _ in range(100):  # exhaust the descriptors: connections that never say anything
                    s = socket.socket()
                    s.setblocking(False)
                    s.connect_ex(("127.0.0.1", port))
                    socks.append(s)
                await asyncio.sleep(1.5)
                frames, t0 = 0, time.monotonic()
                while time.monotonic() - t0 < 1.5:
                    await asyncio.wait_for(ws.recv(), 2)
                    frames += 1
                return frames

        assert asyncio.run(watch()) > 10  # the connected client is still served
    finally:
        for s in socks:
            s.close()
        serve.terminate()
        serve.wait(10)
        serve.stdout.close()
    err.seek(0)
    log = err.read()
    assert "Traceback" not in log and len(log.splitlines()) <= 6, log[:2000]
    assert "refusing new connections for now: Too many open files" in log
