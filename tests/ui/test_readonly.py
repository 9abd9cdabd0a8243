"""`--readonly` (or no token) hides every control and refuses it; the engine is never changed."""
from __future__ import annotations

import pytest

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.keymap import KEYMAP

WRITE = [c for c in KEYMAP if c.needs_write]


def _footer_actions(app) -> set[str]:
    return {key.action for key in app.screen.query("FooterKey")}


@pytest.mark.parametrize("how", ["readonly-flag", "no-token"])
async def test_readonly_hides_and_refuses_every_control(served, how, until):
    if how == "readonly-flag":
        source = LiveSource(served.url, token=served.token, readonly=True)
    else:
        source = LiveSource(served.url)
    before = served.engine.config_record()
    app = PdtopApp(source)
    async with app.run_test(size=(130, 40)) as pilot:
        await until(pilot, lambda: app.connection == "live" and app.state.rounds_seen > 2, "live rounds")
        assert app.readonly
        await pilot.pause()
        footer = _footer_actions(app)
        palette = {c.title for c in app.get_system_commands(app.screen)}
        for cmd in WRITE:
            assert f"run_command('{cmd.id}')" not in footer, cmd.id
            assert cmd.description not in palette, cmd.id
        assert "quit" in {c.id for c in KEYMAP if f"run_command('{c.id}')" in footer}

        for cmd in WRITE:  # every write key is refused out loud, and no prompt opens
            app.notices.clear()
            await pilot.press(cmd.key)
            assert len(app.screen_stack) == 1, cmd.id
            assert app.notices and app.notices[-1][0] == "error" and "refused" in app.notices[-1][2], cmd.id
        for cmd in WRITE:  # and so is running them any other way (palette callback, action)
            app.notices.clear()
            app.action_run_command(cmd.id)
            assert "refused" in app.notices[-1][2], cmd.id
        await pilot.pause(0.3)
        assert "read-only" in app.query_one("HeaderBar").text
    after = served.engine.config_record()
    for key in ("decode_bs_divisor", "pinned_level", "split_forward_token_budget", "chunk_size", "policy",
                "manual_divisions", "workload_rate", "workload_paused"):
        assert getattr(after, key) == getattr(before, key), key
    assert served.server.recorder is None


async def test_help_lists_only_what_is_allowed(served, until):
    app = PdtopApp(LiveSource(served.url, token=served.token, readonly=True))
    async with app.run_test(size=(130, 40)) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "the help screen")
        listed = {c.id for c in app.screen.commands}
        assert not listed & {c.id for c in WRITE}
        assert {"help", "quit", "itl_slo", "theme"} <= listed
        await pilot.press("escape")
        await until(pilot, lambda: len(app.screen_stack) == 1, "help closed")
