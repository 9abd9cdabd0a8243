"""Themes are data files: loaded at start, chosen with --theme, switched at runtime, shipped in the package."""
from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.launch import check_theme
from pdtop.ui.themes import ThemeError, load_themes, theme_from_mapping

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_themes_load_with_pdtop_colours():
    themes = load_themes()
    assert {"pdtop-dark", "pdtop-light", "pdtop-amber", "pdtop-ocean"} <= set(themes)
    for theme in themes.values():
        assert theme.variables["pdtop-prefill"].startswith("#") and theme.variables["pdtop-decode"].startswith("#")
    assert not themes["pdtop-light"].dark and themes["pdtop-dark"].dark
    # the package's themes/ is the repository's themes/ (a link), so a wheel carries the same files
    assert sorted(p.name for p in (ROOT / "pdtop" / "themes").glob("*.yaml")) == \
        sorted(p.name for p in (ROOT / "themes").glob("*.yaml"))


def test_bad_theme_files_are_clear_errors(tmp_path):
    with pytest.raises(ThemeError, match="unknown keys"):
        theme_from_mapping({"name": "x", "primary": "#000000", "colour": "red"}, "x.yaml")
    with pytest.raises(ThemeError, match="`primary` is required"):
        theme_from_mapping({"name": "x"}, "x.yaml")
    with pytest.raises(ThemeError, match="unknown pdtop colours"):
        theme_from_mapping({"name": "x", "primary": "#000000", "pdtop": {"prefil": "#fff"}}, "x.yaml")
    (tmp_path / "mine.yaml").write_text("name: mine\nprimary: '#123456'\npdtop:\n  decode: '#00ff00'\n")
    mine = load_themes([tmp_path])["mine"]
    assert mine.variables["pdtop-decode"] == "#00ff00" and mine.variables["pdtop-prefill"]  # default kept
    assert check_theme("no-such-theme").startswith("unknown theme 'no-such-theme'")
    assert check_theme("pdtop-amber") is None and check_theme("nord") is None


def test_a_theme_file_is_plain_yaml_and_its_errors_are_short(tmp_path):
    """Issue 38 item 8, for themes: a file of nested aliases is refused in one line; a key is named short."""
    from tests.conftest import yaml_bomb

    (tmp_path / "bomb.yaml").write_text(f"name: bomb\nprimary: {yaml_bomb(6)}\n")
    with pytest.raises(ThemeError) as refused:
        load_themes([tmp_path])
    assert "an anchor (&a)" in str(refused.value) and len(str(refused.value)) < 300
    with pytest.raises(ThemeError) as refused:
        theme_from_mapping({"name": "x", "primary": "#000000", 1: 2, "\x1b]0;pwned\x07" + "z" * 9999: 3}, "x.yaml")
    line = str(refused.value)
    assert line.startswith("x.yaml: unknown keys [1, '\\x1b]0;pwned") and "\x1b" not in line and len(line) < 400


async def test_theme_from_option_key_and_palette(recording):
    app = PdtopApp(ReplaySource(recording), theme="pdtop-light")
    async with app.run_test(size=(130, 40)) as pilot:
        assert app.theme == "pdtop-light"
        split = app.query_one("SplitPanel")
        assert split.colour("prefill") == app.pdtop_themes["pdtop-light"].variables["pdtop-prefill"]
        await pilot.press("t")
        assert app.theme == "pdtop-ocean"  # the next one, alphabetically
        await pilot.pause()
        assert split.colour("decode") == app.pdtop_themes["pdtop-ocean"].variables["pdtop-decode"]
        (entry,) = [c for c in app.get_system_commands(app.screen) if c.title == "theme: pdtop-amber"]
        entry.callback()
        assert app.theme == "pdtop-amber"
    with pytest.raises(ValueError, match="unknown theme"):
        PdtopApp(ReplaySource(recording), theme="nope")


async def test_slo_line_is_set_from_its_prompt(recording, until):
    app = PdtopApp(ReplaySource(recording, speed=16))
    async with app.run_test(size=(130, 40)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 10, "rounds")
        await pilot.press("s")
        await until(pilot, lambda: len(app.screen_stack) == 2, "the SLO prompt")
        app.screen.query_one(Input).value = "20"
        await pilot.press("enter")
        assert app.state.itl_slo_s == pytest.approx(0.020)
        app.repaint()
        assert "SLO 20.0 ms" in str(app.query_one("StepTimePanel").render_state(app.state).renderables[0])
        await pilot.press("s")
        await until(pilot, lambda: len(app.screen_stack) == 2, "the SLO prompt again")
        assert app.screen.query_one(Input).value == "20"
        app.screen.query_one(Input).value = "fast"
        await pilot.press("enter")
        assert app.state.itl_slo_s == pytest.approx(0.020) and app.notices[-1][0] == "error"
