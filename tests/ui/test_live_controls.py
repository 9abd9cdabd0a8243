"""Every control of the dashboard changes the real engine's configuration (asserted on the engine)."""
from __future__ import annotations

from textual.widgets import Input

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp

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


async def test_every_control_reaches_the_engine(served, until):
    engine = served.engine
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        cfg = engine.config_dict

        # level down / up move the pinned level; `a` goes back to automatic. Start from a level
        # pinned on the engine's side, so rounds arriving meanwhile cannot move the starting point.
        engine.control({"cmd": "pin_level", "level": 3})
        await until(pilot, lambda: app.state.level == 3 and app.state.pinned, "level 3 pinned in the rounds")
        await pilot.press("minus")
        await until(pilot, lambda: cfg()["pinned_level"] == 2, "level down")
        pinned = 2
        await until(pilot, lambda: app.state.level == pinned and app.state.pinned, "the pinned level in the rounds")
        await pilot.press("plus")
        await until(pilot, lambda: cfg()["pinned_level"] == pinned + 1, "level up")
        await pilot.press("a")
        await until(pilot, lambda: cfg()["pinned_level"] is None, "automatic level")

        await _answer(pilot, "d", "24")
        await until(pilot, lambda: cfg()["decode_bs_divisor"] == 24, "decode_bs_divisor 24")
        await _answer(pilot, "b", "32768")
        await until(pilot, lambda: cfg()["split_forward_token_budget"] == 32768, "budget 32768")
        await _answer(pilot, "c", "256")
        await until(pilot, lambda: cfg()["chunk_size"] == 256, "chunk size 256")
        await _answer(pilot, "m", "112 20 1; 96 36 16")
        await until(pilot, lambda: cfg()["manual_divisions"] == [[112, 20, 1], [96, 36, 16]], "manual divisions")
        await until(pilot, lambda: (96, 36) in app.state.levels and (104, 28) not in app.state.levels,
                    "the dashboard shows the new levels")
        await _answer(pilot, "r", "3.5")
        await until(pilot, lambda: cfg()["workload_rate"] == 3.5, "workload rate 3.5")
        await pilot.press("w")
        await until(pilot, lambda: cfg()["workload_paused"] is True, "workload paused")
        await until(pilot, lambda: app.state.config is not None and app.state.config.workload_paused,
                    "the dashboard saw the pause")
        await pilot.press("w")
        await until(pilot, lambda: cfg()["workload_paused"] is False, "workload resumed")
        await _answer(pilot, "p", "chunked")
        await until(pilot, lambda: cfg()["policy"] == "chunked", "policy chunked")

        injected = []
        engine.add_sink(lambda r: injected.append(r) if getattr(r, "prompt_tokens", 0) == 12000 else None)
        await _answer(pilot, "i", "12000")
        await until(pilot, lambda: any(r.kind == "arrival" for r in injected), "the engine took the injected prompt")
        assert not [n for n in app.notices if n[0] == "error"], app.notices


async def test_engine_refusal_is_shown(served, until):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        await _answer(pilot, "p", "")
        await pilot.press(*"bogus")  # typed: keys that are also commands (b, s) go to the prompt
        assert app.screen.query_one(Input).value == "bogus"
        await pilot.press("enter")
        await until(pilot, lambda: any(sev == "error" for sev, _t, _m in app.notices), "an error notification")
        _, title, message = [n for n in app.notices if n[0] == "error"][-1]
        assert "policy" in message and title == "refused"
        assert served.engine.config_dict()["policy"] == "pdmux"


async def test_recording_start_stop(served, tmp_path, until):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    target = tmp_path / "from-dashboard.ndjson"
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        from pdtop.ui.commands import BY_ID

        app.execute(BY_ID["record"], str(target))
        await until(pilot, lambda: served.server.recorder is not None, "the server records")
        assert app.state.recording == str(target)
        await pilot.press("R")
        await until(pilot, lambda: served.server.recorder is None, "the server stopped recording")
        assert app.state.recording is None
    assert target.read_text().startswith('{"format":"pdtop-recording"')
