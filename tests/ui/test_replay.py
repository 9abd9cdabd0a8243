"""Replay: play/pause, step, seek, speed and go-to move through a real recording; the engine is out of reach."""
from __future__ import annotations

import subprocess
import sys

import pytest
from telemetry.disagg_servers import SglangPdMetrics, serve
from textual.widgets import Input

from pdtop import format as fmt
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Seek
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.screens.fleet import FleetScreen
from pdtop.ui.widgets.replay_bar import ReplayBar

SIZE = (130, 40)


async def test_replay_transport(recording, until):
    src = ReplaySource(recording)
    app = PdtopApp(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 3, "replayed rounds")
        assert app.connection == "replay" and app.readonly
        assert app.state.info.device == "sim:H100" and len(app.state.levels) == 8

        await pilot.press("space")
        assert src.paused
        await pilot.pause(0.2)
        seen, index = app.state.rounds_seen, app.state.round_index
        await pilot.pause(0.3)
        assert app.state.rounds_seen == seen, "paused: nothing more arrives"

        await pilot.press("full_stop")
        await until(pilot, lambda: app.state.rounds_seen == seen + 1, "one step = one more round")
        assert app.state.round_index == index + 1 and src.paused

        before = src.position
        await pilot.press("right")
        assert src.position == pytest.approx(before + 5)
        target = src.position
        # the seek resets the rolling buffers and refills them with the window before the seek point, paused
        await until(pilot, lambda: app.state.rounds and not src.catching_up
                    and target - 0.1 < app.state.time <= target, "the window before the seek point")
        assert src.paused and app.state.rounds[0].time >= target - app.state.window_s
        shown = len(app.state.rounds)
        await pilot.press("full_stop")
        await until(pilot, lambda: len(app.state.rounds) == shown + 1, "a step after the seek")
        assert app.state.round_index > index + 100  # about 5 s further on
        here = src.position
        await pilot.press("left")
        assert src.position == pytest.approx(here - 5)

        await pilot.press("g")
        await until(pilot, lambda: len(app.screen_stack) == 2, "go-to prompt")
        app.screen.query_one(Input).value = "0:12.5"
        await pilot.press("enter")
        await until(pilot, lambda: src.position == pytest.approx(12.5), "position 12.5 s")
        await pilot.press("full_stop")
        await until(pilot, lambda: app.state.rounds, "a round after go-to")
        assert 12.5 <= app.state.time <= 12.6  # the recording's clock is the engine's

        assert src.speed == 1.0
        await pilot.press("greater_than_sign")
        assert src.speed == 2.0
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign", "less_than_sign")
        assert src.speed == 0.25
        assert app.notices[-1][0] == "warning"  # no slower than 0.25x
        for _ in range(8):
            await pilot.press("greater_than_sign")
        assert src.speed == 16.0

        bar = app.query_one("ReplayBar")
        await pilot.press("space")
        assert not src.paused
        await until(pilot, lambda: src.at_end, "played to the end at 16x")
        await until(pilot, lambda: app.state.prefills, "the injected prompt in prefill at the end")
        app.repaint()
        assert "end" in str(bar.render()) or src.at_end

        # the engine cannot be reached from a replay
        app.notices.clear()
        await pilot.press("d")
        assert len(app.screen_stack) == 1 and "refused" in app.notices[-1][2]


async def test_replay_state_matches_the_recording(recording, until):
    """Played to the end, the dashboard holds what the file holds (config, counts, levels)."""
    from pdtop.telemetry.recording.reader import read_recording

    rec = read_recording(recording)
    rounds = [e for _t, e in rec if e["type"] == "round"]
    src = ReplaySource(recording, speed=16)
    app = PdtopApp(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen == len(rounds), "every round", timeout=30)
        assert app.state.config is not None and app.state.config.decode_bs_divisor == 12
        assert app.state.round_index == rounds[-1]["index"]
        assert app.state.level == rounds[-1]["level"]
        assert app.state.arrivals == sum(1 for _t, e in rec if e.get("kind") == "arrival")
        assert app.state.invalid == 0 and app.state.skipped == 0  # every recorded event decodes


async def test_an_unreadable_event_is_skipped_and_shown_once(tmp_path, ev, until):
    from pdtop.telemetry.recording.recorder import Recorder

    rec = Recorder(tmp_path / "bad.ndjson", ev.hello)
    for i in range(3):
        bad = ev.round(i, 0.01 * (i + 1))
        del bad["kv_used_tokens"]  # a renamed or dropped field: never read as 0
        rec.write_event(bad, t=0.01 * i)
    rec.write_event(ev.round(3, 0.04), t=0.03)
    rec.close()
    app = PdtopApp(ReplaySource(tmp_path / "bad.ndjson", speed=16))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen == 1, "the good round")
        assert app.state.invalid == 3 and app.state.round_index == 3
        shown = [n for n in app.notices if n[1] == "unreadable event skipped"]
        assert [n[2] for n in shown] == ["round.kv_used_tokens: missing"]


async def test_a_repaint_queued_as_the_app_shuts_down_does_nothing(recording, until):
    """The source's last events queue a repaint (`repaint_soon`); if it runs after the screens are gone
    (seen under load in CI: an IndexError from the tick), it must do nothing."""
    app = PdtopApp(ReplaySource(recording, speed=16))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 3, "replayed rounds")
    assert not app.screen_stack
    app.repaint()  # the tick, with no screen left


@pytest.mark.parametrize("kind, hinted", [("sim", False), ("cuda", True)])
async def test_the_nvml_hint_is_only_for_a_gpu(tmp_path, ev, until, kind, hinted):
    """Issue 25 item 13: on a cpu or simulated device NVML has nothing to give, so the bandwidth panel
    does not spend its rows (3 of 5 at 80x24) saying so; on a cuda device the reason is shown."""
    from pdtop.telemetry.recording.recorder import Recorder

    hello = ev.hello
    hello["engine"]["device"]["kind"] = kind
    rec = Recorder(tmp_path / "hw.ndjson", hello)
    for i in range(5):
        rec.write_event(ev.round(i, 0.01 * (i + 1)), t=0.01 * i)
    rec.write_event({"type": "hw", "v": 1, "time": 0.05, "cpu_percent": [10.0, 20.0], "host_mem_used_bytes": 1 << 30,
                     "host_mem_total_bytes": 1 << 32, "host_mem_percent": 25.0, "dram_bw_util_pct": "n/a",
                     "gpu_reason": "nvidia-ml-py is not installed: pip install 'pdtop[gpu]'"}, t=0.05)
    rec.close()
    app = PdtopApp(ReplaySource(tmp_path / "hw.ndjson", speed=16))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.hw is not None, "the hw sample")
        app.repaint()
        await pilot.pause()
        panel = app.query_one("BandwidthPanel")
        lines = [t.plain for t in panel.render_state(app.state).renderables]
        said = " ".join(lines) + (panel.hint_hidden or "") + app.status_text().plain
        assert ("NVML n/a" in said) == hinted, said
        if not hinted:  # the rows the hint took go to the chart and the host's line
            assert any(line.startswith("host mem 25%") and "cpu 10% 20%" in line for line in lines), lines


async def test_ctrl_c_quits(recording, until):
    """Issue 25 item 8: Ctrl+C showed "Do you want to quit?: Press [b]ctrl+q[/b] …" as raw markup and
    stayed; it quits now, as in every `top`."""
    app = PdtopApp(ReplaySource(recording))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 0, "a round")
        await pilot.press("ctrl+c")
        await pilot.pause(0.2)
        assert not app.is_running and not any("ctrl+q" in n[2] for n in app.notices), app.notices


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_seek_shows_the_figures_of_the_window_before_it(recording, until, size):
    """Issue 25 item 18: a seek blanked every figure (TTFT p50 -, level times -) until playback resumed."""
    src = ReplaySource(recording)
    app = PdtopApp(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 3, "replayed rounds")
        await pilot.press("space")
        app.notices.clear()
        app.action_replay_seek(15.0)
        await until(pilot, lambda: not src.catching_up and app.state.rounds and app.state.time > 14.9,
                    "the window before 15 s")
        assert src.paused and src.position == pytest.approx(15.0)
        assert app.state.ttfts and app.state.itls, "TTFT and ITL figures at the seek point"
        app.repaint()
        await pilot.pause(0.1)
        split = "\n".join(t.plain for t in app.query_one("SplitPanel")._last_texts)
        assert "%" in split, split  # the level table's time shares
        # the decode_bs_divisor change at round 1200 (about 7.7 s) is in the window: on the chart, not told again
        assert any("decode_bs_divisor" in c.changes for c in app.state.config_changes)
        assert not [n for n in app.notices if n[1] == "changed"], app.notices


def _panels(app) -> dict[str, list[str]]:
    """What every panel shows now, line by line."""
    app.repaint()
    return {panel.id: [t.plain for t in panel._last_texts] for panel in app.query("Panel")}


async def _seek(pilot, until, app, src, position: float) -> None:
    """Seek and wait until the window before the position has been replayed."""
    seen: list = []
    app.event_listeners.append(seen.append)
    app.action_replay_seek(position)
    await until(pilot, lambda: any(isinstance(e, Seek) and e.position == position for e in seen)
                and not src.catching_up and src._cursor >= src._catch_up_to, f"the seek to {position}")
    app.event_listeners.remove(seen.append)
    await pilot.pause(0.05)


async def _fresh_at(recording, position: float, size, until) -> dict[str, list[str]]:
    """The panels of a fresh replay, paused, taken to `position` (none: left at the start)."""
    src = ReplaySource(recording)
    src.pause()
    app = PdtopApp(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.hello, "the recording's hello")
        if position:
            await _seek(pilot, until, app, src, position)
        return _panels(app)


async def test_a_paused_replay_resized_shows_what_a_fresh_replay_at_that_size_shows(recording, until):
    """The trial of issue 42: a paused replay taken from 160x48 to 80x24 kept the wide picture, cut ("level 5
    pinned ■ prefill 80 ■ decode…", "SLO non"), until the next event; nothing repaints a paused replay."""
    fresh = await _fresh_at(recording, 10.0, (80, 24), until)
    src = ReplaySource(recording)
    src.pause()
    app = PdtopApp(src)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.hello, "the recording's hello")
        await _seek(pilot, until, app, src, 10.0)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        assert src.paused and src.position == pytest.approx(10.0)
        shown = {panel.id: [t.plain for t in panel._last_texts] for panel in app.query("Panel")}  # no repaint asked
        assert shown == fresh
        assert len(app.query_one("HeaderBar").text) <= 80  # fitted again: tighter separators, short forms
        bar = app.query_one(ReplayBar)
        assert len(str(bar.content)) == bar.content_size.width < 80  # the bar spans the new width


async def test_a_seek_either_way_shows_what_a_fresh_replay_there_shows(recording, until):
    """Issue 42 item 3: a seek back to 0:00 left the 0:20 values (level, running, decode batch, KV)."""
    size = (160, 48)
    at_start, at_10 = await _fresh_at(recording, 0.0, size, until), await _fresh_at(recording, 10.0, size, until)
    src = ReplaySource(recording)
    app = PdtopApp(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 3, "replayed rounds")
        await pilot.press("space")
        await _seek(pilot, until, app, src, 15.0)
        assert app.state.level is not None and app.state.running
        await _seek(pilot, until, app, src, 10.0)  # back
        assert _panels(app) == at_10
        await _seek(pilot, until, app, src, 0.0)  # back to the start
        assert app.state.level is None and not app.state.running and not app.state.kv_capacity
        assert _panels(app) == at_start
        await _seek(pilot, until, app, src, 10.0)  # and forward
        assert _panels(app) == at_10


async def test_counts_after_a_seek_are_those_of_the_recording_played_to_there(recording, until):
    """Issue 42 item 11: after a seek the counts started from the window's events ("arrived 2 first token 6")."""
    rec = read_recording(recording)
    hello = decode_event(rec.hello)
    src = ReplaySource(recording)
    src.lookback_s = 3.0  # a window shorter than the file: requests arrived before it finish in it
    app = PdtopApp(src)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 3, "replayed rounds")
        await pilot.press("space")
        for position in (15.0, 4.0, 12.0):
            await _seek(pilot, until, app, src, position)
            kinds = [e for t, e in rec if t < position and e["type"] == "request"]
            arrived = hello.engine.totals.arrived + sum(e["kind"] == "arrival" for e in kinds)
            first = hello.engine.totals.first_token + sum(e["kind"] == "first_token" for e in kinds)
            s = app.state
            assert (s.arrivals, s.first_tokens) == (arrived, first), position
            assert s.arrivals >= s.first_tokens >= s.finished and s.counts_since == "engine start"


async def test_a_replayed_fleet_says_it_is_a_replay_with_its_position_and_keys(tmp_path, until):
    """Issue 42 item 4: a replayed fleet looked live ("2 live · read every 1.0 s") with no play state,
    position or bar until Enter on a server."""
    prefill, decode = serve(SglangPdMetrics("prefill")), serve(SglangPdMetrics("decode"))
    path = tmp_path / "fleet.ndjson"
    try:
        done = subprocess.run([sys.executable, "-m", "pdtop", "record", "--prefill", prefill.server.url,
                               "--decode", decode.server.url, "-o", str(path), "--interval", "0.1", "--duration",
                               "2"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        prefill.server.close()
        decode.server.close()
    src = ReplaySource(path)
    app = PdtopApp(src)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.state.fleet.servers, "the fleet")
        await pilot.press("space")
        assert src.paused
        await pilot.pause(0.4)
        head = str(app.screen.query_one("#fleet-head").render())
        bar = str(app.screen.query_one(ReplayBar).render())
        assert "replay" in head and "live when recorded" in head, head
        assert "paused" in bar and f"/ {fmt.clock(src.duration)}" in bar, bar
        await pilot.press("right")
        assert src.position == pytest.approx(src.duration)  # the keys seek from the fleet's table too


async def test_a_recorded_error_reason_is_shown_with_its_escapes_visible(tmp_path, ev, until):
    """Issue 38 item 3: a server's (or a recording's) error reason is outside text: an OSC 52 clipboard
    write, a title change and Rich markup reach the status line as visible characters, never obeyed."""
    from pdtop.telemetry.recording.recorder import Recorder

    rec = Recorder(tmp_path / "err.ndjson", ev.hello)
    rec.write_event(ev.round(0, 0.01), t=0.0)
    reason = "\x1b]52;c;cHduZWQ=\x07 [/] \x1b]0;title\x07\x1b[2J done"
    rec.write_event({"type": "error", "v": 1, "field": None, "reason": reason}, t=0.01)
    rec.write_event(ev.round(1, 0.02), t=0.02)
    rec.close()
    app = PdtopApp(ReplaySource(tmp_path / "err.ndjson", speed=16))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(n[0] == "error" for n in app.notices), "the error notice")
        message = next(n[2] for n in app.notices if n[0] == "error")
        assert "\x1b" not in message and "\x07" not in message
        assert message == "engine: \\x1b]52;c;cHduZWQ=\\x07 [/] \\x1b]0;title\\x07\\x1b[2J done"
        await pilot.pause(0.1)
        assert "\x1b" not in app.status_text().plain
