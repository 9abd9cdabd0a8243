"""The one command table: parsers, message builders, and that it drives bindings, help and palette."""
from __future__ import annotations

import dataclasses

import pytest

from pdtop.engine.scheduling.commands import PauseWorkload, PinLevel, ResumeWorkload, Set
from pdtop.telemetry.server.commands import RecordStart, RecordStop
from pdtop.ui.keymap import BY_ID, KEYMAP, parse_divisions, parse_seconds, parse_slo_ms
from pdtop.ui.state import DashboardState


@pytest.fixture
def state_at(ev):
    def make(level: int = 4) -> DashboardState:
        s = DashboardState()
        s.ingest(ev.hello)
        s.ingest(ev.round(0, 0.01, level=level))
        return s

    return make


def test_level_builders_step_from_the_level_on_screen(state_at):
    s = state_at(4)
    assert BY_ID["level_up"].build(s, None) == PinLevel(5)  # nothing painted yet
    s.shown_level = 2  # under auto the engine's level moved on since the screen showed 2
    assert BY_ID["level_up"].build(s, None) == PinLevel(3)
    assert BY_ID["level_down"].build(s, None) == PinLevel(1)
    with pytest.raises(ValueError, match="already at level 7"):
        BY_ID["level_up"].build(state_at(7), None)
    with pytest.raises(ValueError, match="no split level"):
        BY_ID["level_up"].build(DashboardState(), None)


def test_policy_is_chosen_from_every_policy():
    from pdtop.engine.scheduling.policies import POLICIES

    arg = BY_ID["policy"].arg
    assert tuple(value for value, _ in arg.choices) == POLICIES and all(meaning for _, meaning in arg.choices)


def test_set_builders_and_toggles(state_at):
    s = state_at()
    assert BY_ID["decode_bs_divisor"].build(s, 24) == Set(decode_bs_divisor=24)
    assert BY_ID["budget"].build(s, 4096) == Set(split_forward_token_budget=4096)
    assert BY_ID["workload_toggle"].build(s, None) == PauseWorkload()
    s.config = dataclasses.replace(s.config, workload_paused=True)
    assert BY_ID["workload_toggle"].build(s, None) == ResumeWorkload()
    start = BY_ID["record"].build(s, None)
    assert isinstance(start, RecordStart) and start.path.endswith(".ndjson")
    s.recording = "x.ndjson"
    assert BY_ID["record"].build(s, None) == RecordStop()
    assert BY_ID["decode_bs_divisor"].arg.default(s) == "36"


def test_every_prompt_has_a_default_before_and_after_hello(state_at):
    """Prompts start from the configuration in force: each names a real setting."""
    s = state_at()
    for cmd in KEYMAP:
        if cmd.arg is not None:
            assert isinstance(cmd.arg.default(DashboardState()), str), cmd.id
            assert isinstance(cmd.arg.default(s), str), cmd.id
    assert BY_ID["manual_divisions"].arg.default(s) == "[]" and BY_ID["policy"].arg.default(s) == "pdmux"

def test_parsers():
    assert parse_divisions("112 20 1; 96,36,16") == [[112, 20, 1], [96, 36, 16]]
    assert parse_divisions("[[112, 20, 1]]") == [[112, 20, 1]]
    assert parse_divisions("") == []
    with pytest.raises(ValueError, match="three whole numbers"):
        parse_divisions("112 20")
    assert parse_seconds("1:02.5") == 62.5 and parse_seconds("7") == 7.0
    assert parse_slo_ms("25") == pytest.approx(0.025) and parse_slo_ms("") is None and parse_slo_ms("0") is None
    with pytest.raises(ValueError):
        BY_ID["decode_bs_divisor"].arg.parse("zero")


def test_table_invariants():
    assert len(BY_ID) == len(KEYMAP), "duplicate command ids"
    assert len({c.key for c in KEYMAP}) == len(KEYMAP), "duplicate command keys"
    for cmd in KEYMAP:
        assert (cmd.build is None) != (cmd.action is None), cmd.id  # a message or a local action
        assert not (cmd.needs_write and cmd.mode == "replay"), cmd.id
        assert cmd.build is None or cmd.needs_write, cmd.id  # anything sent to the engine needs write


async def test_bindings_help_and_palette_come_from_the_table(recording):
    from pdtop.telemetry.sources.replay import ReplaySource
    from pdtop.ui.app import PdtopApp

    app = PdtopApp(ReplaySource(recording))
    assert {b.id for b in app.BINDINGS} == {f"pdtop.{c.id}" for c in KEYMAP}
    async with app.run_test(size=(130, 40)) as pilot:
        await pilot.pause()
        replay = {c.description for c in KEYMAP if c.mode in ("any", "replay")}
        palette = {c.title for c in app.get_system_commands(app.screen) if not c.title.startswith("theme:")}
        assert palette == replay
        footer = {key.action for key in app.screen.query("FooterKey")} - {"command_palette"}
        assert footer == {f"run_command('{c.id}')" for c in KEYMAP if c.footer and c.description in replay}
        await pilot.press("question_mark")
        await pilot.pause()
        assert {c.description for c in app.screen.commands} == replay
        box = app.screen.query_one("VerticalScroll")
        assert box.size.width >= 60 and box.size.height >= len(replay)  # the table is visible, not collapsed


def test_docs_list_every_command():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text()
    for cmd in KEYMAP:
        assert f"| `{cmd.key_display or cmd.key}` | {cmd.description} |" in doc, cmd.id


def test_interval_option_sets_the_refresh(tmp_path):
    import argparse
    import subprocess
    import sys

    from pdtop.commands import attach
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.ui.launch import check_ui_options, make_app

    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    args = parser.parse_args(["ws://127.0.0.1:9", "--interval", "0.5"])
    assert check_ui_options(args) is None
    assert make_app(LiveSource(args.url), args).interval_s == 0.5
    args = parser.parse_args(["ws://127.0.0.1:9"])
    attach.make_source(args)  # resolves the default (for http:// URLs --interval is the /metrics read's)
    assert args.interval == 0.1
    for bad in ("0", "60", "nan"):
        assert "--interval" in check_ui_options(parser.parse_args(["ws://127.0.0.1:9", "--interval", bad]))
    result = subprocess.run([sys.executable, "-m", "pdtop", "attach", "ws://127.0.0.1:9", "--interval", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--interval must be 0.02 to 10 seconds" in result.stderr
