"""Every control of the dashboard changes the real engine's configuration (asserted on the engine)."""
from __future__ import annotations

from textual.widgets import Input

from pdtop.engine.scheduling.commands import PinLevel
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.keymap import BY_ID

from .conftest import stepping_until

SIZE = (130, 40)


async def _answer(pilot, key: str, text: str) -> None:
    """Press a command's key, put `text` in its prompt (replacing the default) and press enter."""
    await pilot.press(key)
    for _ in range(250):  # the prompt opens from the key's handler; allow the app a few frames
        if len(pilot.app.screen_stack) == 2:
            break
        await pilot.pause(0.02)
    assert len(pilot.app.screen_stack) == 2, f"no prompt for {key!r}"
    pilot.app.screen.query_one(Input).value = text  # typing key by key works too, but slowly under load
    if text:
        await pilot.press("enter")


def _accepted(app) -> list[tuple[str, str, str]]:
    """The answers to applied controls among the notifications (others, e.g. `dropped`, may come in between)."""
    return [n for n in app.notices if n[1] == "applied"]


async def test_every_control_reaches_the_engine(served, until):
    engine = served.engine
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        cfg = engine.config_record

        # level down / up move the pinned level; `a` goes back to automatic. Start from a level
        # pinned on the engine's side, so rounds arriving meanwhile cannot move the starting point.
        engine.control(PinLevel(3))
        await until(pilot, lambda: app.state.shown_level == 3 and app.state.pinned, "level 3 pinned, on screen")
        await pilot.press("minus")
        await until(pilot, lambda: cfg().pinned_level == 2, "level down")
        await until(pilot, lambda: _accepted(app), "the answer")
        assert _accepted(app)[-1][2] == "pinned level 2: prefill 104 SMs, decode 28"  # words, not `pin_level level=2`
        pinned = 2
        await until(pilot, lambda: app.state.shown_level == pinned and app.state.pinned, "the pinned level on screen")
        await pilot.press("plus")
        await until(pilot, lambda: cfg().pinned_level == pinned + 1, "level up")
        await pilot.press("a")
        await until(pilot, lambda: cfg().pinned_level is None, "automatic level")

        await _answer(pilot, "d", "24")
        await until(pilot, lambda: cfg().decode_bs_divisor == 24, "decode_bs_divisor 24")
        await _answer(pilot, "b", "32768")
        await until(pilot, lambda: cfg().split_forward_token_budget == 32768, "budget 32768")
        await _answer(pilot, "c", "256")
        await until(pilot, lambda: cfg().chunk_size == 256, "chunk size 256")
        await _answer(pilot, "m", "112 20 1; 96 36 16")
        await until(pilot, lambda: cfg().manual_divisions == [(112, 20, 1), (96, 36, 16)], "manual divisions")
        await until(pilot, lambda: (96, 36) in app.state.levels and (104, 28) not in app.state.levels,
                    "the dashboard shows the new levels")
        await _answer(pilot, "r", "3.5")
        await until(pilot, lambda: cfg().workload_rate == 3.5, "workload rate 3.5")
        await pilot.press("w")
        await until(pilot, lambda: cfg().workload_paused is True, "workload paused")
        await until(pilot, lambda: app.state.config is not None and app.state.config.workload_paused,
                    "the dashboard saw the pause")
        await pilot.press("w")
        await until(pilot, lambda: cfg().workload_paused is False, "workload resumed")
        await pilot.press("p")  # the policy is picked from a list, not typed
        await until(pilot, lambda: type(app.screen).__name__ == "ChoiceScreen", "the policy list")
        assert app.screen.query_one("OptionList").highlighted == 0  # pdmux, the one in force
        await pilot.press("down", "enter")
        await until(pilot, lambda: cfg().policy == "chunked", "policy chunked")

        injected = []
        engine.add_sink(lambda r: injected.append(r) if getattr(r, "prompt_tokens", 0) == 12000 else None)
        await _answer(pilot, "i", "12000")
        await until(pilot, lambda: any(r.kind == "arrival" for r in injected), "the engine took the injected prompt")
        assert not [n for n in app.notices if n[0] == "error"], app.notices


async def test_engine_refusal_is_shown(served, until):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        await _answer(pilot, "m", "")
        await pilot.press(*"500 20 1")  # typed: keys that are also commands go to the prompt
        assert app.screen.query_one(Input).value == "500 20 1"
        await pilot.press("enter")
        await until(pilot, lambda: any(sev == "error" for sev, _t, _m in app.notices), "an error notification")
        _, title, message = [n for n in app.notices if n[0] == "error"][-1]
        assert title == "refused" and "uses 520 SMs, the device has 132" in message
        assert served.engine.config_record().manual_divisions == []
        await until(pilot, lambda: "refused" in app.query_one("StatusLine").text, "shown under the header")


async def test_under_auto_plus_steps_from_the_level_on_screen(stepped, until):
    """The engine's own level moves every round; + pins the one next to what the operator sees."""
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        for _ in range(40):
            engine.step()
        target = engine.scheduler.round_index - 1
        await until(pilot, lambda: app.state.round_index == target and app.state.shown_level == app.state.level,
                    "the latest round on screen")
        shown = app.state.shown_level
        key, want = ("plus", shown + 1) if shown < len(app.state.levels) - 1 else ("minus", shown - 1)
        await pilot.press(key)
        engine.step()  # the pin applies at the next round boundary
        await until(pilot, lambda: engine.config_record().pinned_level == want, f"level {want} pinned")


async def test_quick_presses_each_step_a_level(stepped, until):
    """The trial of issue 42: three quick presses of - (faster than the engine's next round) pinned one level
    down, not three: each stepped from the level on screen, which had not moved yet."""
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        engine.control(PinLevel(5))
        engine.step()
        await until(pilot, lambda: app.state.shown_level == 5 and app.state.pinned, "level 5 pinned, on screen")
        await pilot.press("minus", "minus", "minus")  # no round in between: the screen still shows 5
        await stepping_until(pilot, engine, lambda: len(_accepted(app)) >= 3, "the three answers")
        assert engine.config_record().pinned_level == 2
        await until(pilot, lambda: app.state.shown_level == 2 and app.state.pending_level is None, "level 2 shown")
        await pilot.press("plus")  # from the screen again
        await stepping_until(pilot, engine, lambda: engine.config_record().pinned_level == 3, "level 3")


async def test_pinning_a_side_to_no_units_warns(stepped, until):
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        while engine.scheduler.round_index < 400 or not engine.scheduler.running:
            engine.step()
        await until(pilot, lambda: app.state.running > 0, "a running batch on screen")
        engine.control(PinLevel(1))
        engine.step()
        await until(pilot, lambda: app.state.shown_level == 1, "level 1 on screen")
        await pilot.press("minus")  # level 0: the whole device to prefill
        await stepping_until(pilot, engine, lambda: _accepted(app), "the answer, once the engine applied it")
        severity, _, message = _accepted(app)[-1]
        assert severity == "warning" and message.startswith("pinned level 0: prefill 132 SMs, decode 0")
        # Issue 25 item 2: it said "the running requests wait" while decode ran on; say what happens
        assert "time-shares prefill's 132 SMs" in message and "wait" not in message
        engine.step()
        decoded = [engine.step() for _ in range(20)]
        assert engine.config_record().pinned_level == 0
        assert sum(r.decode_bs for r in decoded if r is not None) > 0, "decode runs on at level 0"


async def test_a_key_says_queued_at_once_and_the_outcome_once_the_engine_applied_it(stepped, until):
    """A long round (here no round boundary comes until the test steps the engine) never leaves a key
    unanswered: "queued" at once, then what the engine changed when its reply comes."""
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        engine.step()
        await until(pilot, lambda: app.state.config is not None and app.state.rounds_seen, "a round on screen")
        await _answer(pilot, "d", "24")
        await until(pilot, lambda: len(engine.controls) == 1, "the command waits for the engine's round boundary")
        assert [n[1:] for n in app.notices if n[1] == "queued"] == [("queued", "decode_bs_divisor 36 → 24")]
        assert "queued: decode_bs_divisor 36 → 24" in app.query_one("StatusLine").text and not _accepted(app)
        await pilot.pause(0.3)
        assert not _accepted(app) and engine.config_record().decode_bs_divisor == 36  # nothing yet
        engine.step()  # the boundary: applied, and the reply carries the change
        await until(pilot, lambda: _accepted(app), "the outcome")
        assert _accepted(app)[-1][2] == "decode_bs_divisor 36 → 24" and engine.config_record().decode_bs_divisor == 24
        assert "applied: decode_bs_divisor 36 → 24" in app.query_one("StatusLine").text
        await _answer(pilot, "d", "24")  # what is already so: applied, nothing changed
        await stepping_until(pilot, engine, lambda: len(_accepted(app)) == 2, "the second outcome")
        assert _accepted(app)[-1][2] == "decode_bs_divisor 24 → 24 (already so)"


async def test_freeze_keeps_the_screen_while_events_come_in(stepped, until):
    engine = stepped.engine
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        for _ in range(50):
            engine.step()
        await until(pilot, lambda: app.state.round_index == engine.scheduler.round_index - 1, "caught up")
        await pilot.press("f")
        await pilot.pause(0.2)
        timeline = app.query_one("TimelinePanel")
        picture, seen = list(timeline._last_texts), app.state.rounds_seen
        assert "frozen" in app.query_one("HeaderBar").text
        for _ in range(50):
            engine.step()
        await until(pilot, lambda: app.state.rounds_seen >= seen + 50, "events still taken")
        await pilot.pause(0.3)
        assert timeline._last_texts == picture
        await pilot.press("f")
        await until(pilot, lambda: timeline._last_texts != picture, "following the engine again")
        assert "frozen" not in app.query_one("HeaderBar").text


async def test_recording_start_stop(served, tmp_path, until):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    target = tmp_path / "from-dashboard.ndjson"
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        app.execute(BY_ID["record"], str(target))
        await until(pilot, lambda: served.server.recorder is not None, "the server records")
        assert app.state.recording == str(target)
        await pilot.press("R")
        await until(pilot, lambda: served.server.recorder is None, "the server stopped recording")
        assert app.state.recording is None
    assert target.read_text().startswith('{"format":"pdtop-recording"')


async def test_without_a_workload_w_says_there_is_none(until):
    """Issue 25 item 5: under `--workload none`, `w` was "accepted: workload resumed" each time while
    nothing arrived. The engine refuses it, and the rate, saying why; the dashboard shows that."""
    from pdtop.engine.build import build_engine
    from pdtop.engine.errors import ControlError
    from pdtop.engine.scheduling.commands import PauseWorkload, Set

    from .conftest import EngineServer

    engine = build_engine("sim:H100", workload=None)
    for command in (PauseWorkload(), Set(workload_rate=2.0)):
        outcome = engine.control(command)
        engine.step()
        exc = outcome.exception(0)
        if not isinstance(exc, ControlError):
            raise AssertionError(f"{command} was accepted without a workload")
        assert exc.field == "workload" and "--workload none" in exc.reason
    es = EngineServer(engine).start()
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.connection == "live" and app.state.rounds_seen > 2, "live rounds")
            await pilot.press("w")
            await until(pilot, lambda: any(n[1] == "refused" for n in app.notices), "the refusal")
            (refused,) = [n for n in app.notices if n[1] == "refused"]
            assert "no workload runs here" in refused[2] and not _accepted(app), app.notices
    finally:
        es.close()
