"""ReplaySource: same events as recorded, pause / step / seek / speed, read-only."""
from __future__ import annotations

import pytest

from pdtop.engine.scheduling.commands import AutoLevel
from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.telemetry.sources.source import ControlRefused

from ..conftest import Pump, config_event, hello_event

HELLO = hello_event()
CONFIG = HELLO["engine"]["config"]  # decode_bs_divisor 36


def _write(path, events):
    rec = Recorder(path, HELLO)
    for t, e in events:
        rec.write_event(e, t=t)
    rec.close()
    return path


@pytest.fixture
def recording(tmp_path):
    """Rounds every 0.1 s for 2 s, a request event between rounds, a config change at 1.0 s."""
    events = []
    for i in range(21):
        t = round(i * 0.1, 3)
        events.append((t, {"type": "round", "v": 1, "index": i, "time": t}))
        events.append((t + 0.05, {"type": "request", "v": 1, "kind": "arrival", "request_id": i}))
        if i == 10:
            events.append((t + 0.06, config_event(t, i, decode_bs_divisor=12)))
    return _write(tmp_path / "r.ndjson.gz", events)


async def test_plays_everything_in_order_at_speed(recording):
    src = ReplaySource(recording, speed=16, hold_at_end=False)
    assert src.state == "replay" and src.readonly
    got = [e async for e in src.events()]
    assert got[0] == HELLO
    rounds = [e["index"] for e in got if e["type"] == "round"]
    assert rounds == list(range(21))
    assert len(got) == 1 + 21 + 21 + 1
    assert src.at_end and src.position == pytest.approx(src.duration)


async def test_send_refuses(recording):
    with pytest.raises(ControlRefused, match="read-only"):
        await ReplaySource(recording).send(AutoLevel())


async def test_pause_then_step_releases_one_round_at_a_time(recording):
    src = ReplaySource(recording)
    src.pause()
    p = Pump(src)
    assert (await p.get())["type"] == "hello"
    assert await p.nothing_for()  # paused: nothing comes
    src.step()
    assert (await p.get()) == {"type": "round", "v": 1, "index": 0, "time": 0.0}
    src.step()  # the request between rounds, then round 1
    assert (await p.get())["type"] == "request"
    assert (await p.get())["index"] == 1
    assert src.position == pytest.approx(0.1)
    assert await p.nothing_for()
    src.resume()
    assert (await p.get())["type"] == "request"
    await src.close()
    await p.task


async def test_seek_announces_itself_with_the_config_in_force(recording):
    src = ReplaySource(recording)
    src.lookback_s = 0.0  # the next event is the one at the seek point
    src.pause()
    p = Pump(src)
    await p.get()
    src.seek(1.5)
    marker = await p.get()
    assert marker["type"] == "seek" and marker["position"] == 1.5
    assert marker["config"] == {**CONFIG, "decode_bs_divisor": 12}  # the change at 1.06 s
    src.step()
    assert (await p.get())["index"] == 15
    src.seek(0.25)  # backwards, before the change
    marker = await p.get()
    assert marker["config"] == CONFIG
    src.step()
    assert (await p.get())["type"] == "request"  # 0.25 is the request after round 2
    assert (await p.get())["index"] == 3
    src.seek(-5)
    assert (await p.get())["position"] == 0.0
    src.seek(99)
    assert (await p.get())["position"] == pytest.approx(src.duration)
    await src.close()
    await p.task


async def test_a_seek_replays_the_window_before_it_at_once_while_paused(recording):
    """Issue 25 item 18: the events of the `lookback_s` before the seek point follow the marker at once,
    paused or not, each `catching_up`; then playback waits at the seek point."""
    src = ReplaySource(recording)
    src.pause()
    src.lookback_s = 0.5
    p = Pump(src)
    await p.get()
    src.seek(1.5)
    marker = await p.get()
    assert marker["config"] == {**CONFIG, "decode_bs_divisor": 12}  # in force at 1.5 s, as before
    times = [t for t in src.recording.times if 1.0 <= t < 1.5]
    got = [await p.get() for _ in times]
    assert times and all(1.0 - 1e-6 <= e["time"] < 1.5 for e in got if "time" in e) and src.paused
    assert await p.nothing_for(0.3)  # then nothing until play or step
    assert not src.catching_up and src.position == 1.5
    await src.close()


async def test_seek_while_playing_continues_from_there(recording):
    src = ReplaySource(recording, speed=16, hold_at_end=False)
    src.lookback_s = 0.0  # (with a window, the window's round 3 would seek again)
    got = []
    async for e in src.events():
        got.append(e)
        if e.get("index") == 3 and e["type"] == "round":
            src.seek(1.8)
    after = [e["index"] for e in got[got.index(next(e for e in got if e["type"] == "seek")):] if e["type"] == "round"]
    assert after == [18, 19, 20]


def test_speed_scales_the_clock_and_is_bounded(recording):
    now = [100.0]
    src = ReplaySource(recording, clock=lambda: now[0])
    now[0] += 0.5
    assert src.position == pytest.approx(0.5)
    src.speed = 4
    now[0] += 0.25
    assert src.position == pytest.approx(1.5)
    src.pause()
    now[0] += 10
    assert src.position == pytest.approx(1.5) and src.paused
    src.resume()
    src.speed = 0.25
    now[0] += 1
    assert src.position == pytest.approx(1.75)
    for bad in (0.1, 17, 0):
        with pytest.raises(ValueError, match=r"between 0\.25 and 16"):
            src.speed = bad
    assert src.speed == 0.25


async def test_hold_at_end_waits_for_a_seek(recording):
    src = ReplaySource(recording, speed=16)
    p = Pump(src)
    for _ in range(1 + 43):
        await p.get()
    assert src.at_end
    assert await p.nothing_for()
    src.lookback_s = 0.5
    src.seek(1.9)
    assert (await p.get())["type"] == "seek"
    window = [await p.get() for t in src.recording.times if 1.4 <= t < 1.9]  # the window before it, at once
    assert window and all(1.4 - 1e-6 <= e["time"] < 1.9 for e in window if "time" in e)
    assert (await p.get())["index"] == 19
    await src.close()
    await p.task


async def test_seek_passes_over_a_config_event_it_cannot_read(tmp_path):
    broken = config_event(0.3, 3, decode_bs_divisor=24)
    del broken["config"]["chunk_size"]
    path = _write(tmp_path / "r.ndjson", [(0.1, config_event(0.1, 1, decode_bs_divisor=12)), (0.3, broken),
                                          (0.5, {"type": "round", "v": 1, "index": 5, "time": 0.5})])
    src = ReplaySource(path)
    src.pause()
    p = Pump(src)
    await p.get()
    src.seek(0.4)
    assert (await p.get())["config"] == {**CONFIG, "decode_bs_divisor": 12}
    await src.close()
    await p.task
