"""Who may connect and where a client may record: a browser page from another site is
refused (cross-site websocket hijacking), `record_start` creates only new files inside the
recordings directory and never follows a symlink, connections are capped, and watchers without the
token leave room for a client with it."""
from __future__ import annotations

import os

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.server.server import TelemetryServer

from ..conftest import Raw, steps


async def test_a_foreign_origin_is_refused(engine, tmp_path):
    async with TelemetryServer(engine, port=0, tick=0.01, record_dir=tmp_path) as server:
        with pytest.raises(InvalidStatus) as refused:
            await connect(server.url, origin="https://evil.example")
        assert refused.value.response.status_code == 403
        assert server.clients == {}
        plain = await Raw.open(server.url)  # the dashboard and the CLI send no Origin
        await plain.wait(lambda c: c.events)
        assert plain.events[0]["type"] == "hello"
        await plain.close()
    assert list(tmp_path.iterdir()) == []


async def test_an_allowed_origin_may_connect(engine):
    async with TelemetryServer(engine, port=0, tick=0.01, allow_origins=["http://localhost:3000"]) as server:
        page = await Raw.open(server.url, origin="http://localhost:3000")
        await page.wait(lambda c: c.events)
        assert page.events[0]["type"] == "hello"
        with pytest.raises(InvalidStatus):
            await connect(server.url, origin="http://localhost:3001")
        await page.close()


@pytest.fixture
async def recorded(engine, tmp_path, monkeypatch):
    """A server whose recordings directory is tmp_path/recordings, next to a user's files outside it.
    Every path the tests ask for stays under tmp_path even if confinement broke (the working
    directory is the recordings directory), so a failing test damages nothing else."""
    inside = tmp_path / "recordings"
    inside.mkdir()
    monkeypatch.chdir(inside)
    (tmp_path / "notes.txt").write_text("the user's own file")
    server = TelemetryServer(engine, port=0, tick=0.01, record_dir=inside)
    await server.start()
    client = await Raw.open(server.url)
    await client.wait(lambda c: c.events)
    yield server, client, inside
    await client.close()
    await server.stop()


@pytest.mark.parametrize("path", [
    "../notes.txt", "../escape.ndjson", "recordings/../../escape.ndjson", "{tmp}/notes.txt", "{tmp}/escape.ndjson",
    "{tmp}/recordings/../notes.txt",
])
async def test_record_start_outside_the_recordings_directory_is_refused(recorded, tmp_path, path):
    server, client, _ = recorded
    reply = await client.request({"cmd": "record_start", "path": path.format(tmp=tmp_path)})
    assert reply["ok"] is False and reply["error"]["field"] == "path"
    assert "outside the recordings directory" in reply["error"]["reason"]
    assert server.recorder is None
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"
    assert not (tmp_path / "escape.ndjson").exists()


async def test_record_start_never_overwrites_nor_follows_symlinks(recorded, tmp_path):
    server, client, inside = recorded
    (inside / "old.ndjson").write_text("an earlier recording")
    os.symlink(tmp_path / "notes.txt", inside / "link.ndjson")  # a link to a file outside
    os.symlink(tmp_path / "nowhere.ndjson", inside / "dangling.ndjson")  # would create a file outside
    os.symlink(tmp_path, inside / "outdir")  # a directory link out
    for path, words in [("old.ndjson", "already exists"), ("link.ndjson", "already exists"),
                        ("dangling.ndjson", "already exists"), ("outdir/new.ndjson", "not a directory inside")]:
        reply = await client.request({"cmd": "record_start", "path": path})
        assert reply["ok"] is False and words in reply["error"]["reason"], (path, reply)
    assert (inside / "old.ndjson").read_text() == "an earlier recording"
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"
    assert not (tmp_path / "nowhere.ndjson").exists() and not (tmp_path / "new.ndjson").exists()
    assert server.recorder is None


async def test_record_start_refuses_a_name_with_control_characters(recorded):
    """Issue 38 item 16: `a\nb`, ESC and BEL made files whose names rewrite a terminal that lists them."""
    server, client, inside = recorded
    for path in ("a\nb.ndjson", "\x1b[2J.ndjson", "bell\x07.ndjson"):
        reply = await client.request({"cmd": "record_start", "path": path})
        assert reply["ok"] is False and reply["error"]["field"] == "path" and "control" in reply["error"]["reason"]
    assert server.recorder is None and list(inside.iterdir()) == []


async def test_record_start_inside_the_directory_works(recorded, engine):
    _, client, inside = recorded
    (inside / "runs").mkdir()
    reply = await client.request({"cmd": "record_start", "path": "runs/a.ndjson.gz"})
    assert reply["ok"] and reply["path"] == str(inside / "runs" / "a.ndjson.gz")
    await steps(engine, 10)
    await client.wait(lambda c: len(c.of("round")) >= 10)
    assert (await client.request({"cmd": "record_stop"}))["ok"]
    assert [e["index"] for _, e in read_recording(inside / "runs" / "a.ndjson.gz") if e["type"] == "round"] \
        == list(range(10))
    absolute = await client.request({"cmd": "record_start", "path": str(inside / "b.ndjson")})
    assert absolute["ok"] and absolute["path"] == str(inside / "b.ndjson")
    assert (await client.request({"cmd": "record_stop"}))["ok"]


async def test_connections_beyond_max_clients_are_refused(engine):
    async with TelemetryServer(engine, port=0, tick=0.01, max_clients=2) as server:
        a, b = await Raw.open(server.url), await Raw.open(server.url)
        await a.wait(lambda c: c.events)
        await b.wait(lambda c: c.events)
        with pytest.raises(InvalidStatus) as refused:
            await connect(server.url)
        assert refused.value.response.status_code == 503
        await b.close()
        await a.wait(lambda c: len(server.clients) == 1)
        c = await Raw.open(server.url)  # room again
        await c.wait(lambda c: c.events)
        await steps(engine, 5)
        await a.wait(lambda c: len(c.of("round")) >= 5)
        for client in (a, c):
            await client.close()


async def test_watchers_without_the_token_leave_room_for_the_operator(engine):
    """64 token-less watchers took every slot, so the operator with the token got a 503."""
    async with TelemetryServer(engine, port=0, tick=0.01, token="s3cret") as server:
        watchers, refused = [], 0
        for i in range(64):
            try:  # a wrong token is no better than none
                watchers.append(await Raw.open(server.url + ("/?token=guess" if i == 0 else "")))
            except InvalidStatus as exc:
                assert exc.response.status_code == 503
                refused += 1
        assert refused == 8 and len(watchers) == 56 and server.reserved == 8
        operators = [await Raw.open(server.url + "/?token=s3cret") for _ in range(server.reserved)]
        for op in operators:
            await op.wait(lambda c: c.events)
            assert op.events[0]["readonly"] is False
        with pytest.raises(InvalidStatus):  # every slot is taken now
            await connect(server.url + "/?token=s3cret")
        await operators[0].close()
        await watchers[0].wait(lambda c: len(server.clients) == 63)
        with pytest.raises(InvalidStatus):  # the freed slot is still kept for the token
            await connect(server.url)
        for c in [*watchers, *operators[1:]]:
            await c.close()
