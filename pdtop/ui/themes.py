"""Dashboard themes as data files: YAML with `textual.theme.Theme` fields plus pdtop's colours.

Where they are looked for, later directories overriding earlier ones by theme name:

1. `pdtop/themes/` inside the package (a symlink to the repository's `themes/` in the
   source tree; setuptools copies the files into wheels through `package-data`),
2. the repository's `themes/` (running from a source checkout without the link),
3. `$PDTOP_THEMES_DIR` or `~/.config/pdtop/themes/` (a user's own themes).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from textual.theme import Theme

from pdtop.plain_yaml import YamlError, read_yaml
from pdtop.typed_json import show, show_key

DEFAULT_THEME = "pdtop-dark"

# pdtop's colours: key under `pdtop:` in a theme file -> CSS variable; values are the fallbacks
# used with themes that do not define them (Textual's built-in themes).
PDTOP_COLOURS: dict[str, str] = {
    "prefill": "#F2A541",
    "decode": "#4C9BE8",
    "idle": "#3B4252",
    "slo": "#E5484D",
    "chart": "#8FBCBB",
}

_THEME_FIELDS = {
    "name", "primary", "secondary", "warning", "error", "success", "accent", "foreground",
    "background", "surface", "panel", "boost", "dark", "luminosity_spread", "text_alpha", "variables",
}


class ThemeError(ValueError):
    """A theme file that cannot be used; the message names the file and the problem."""


def variable(key: str) -> str:
    """The CSS variable name of one of pdtop's colours: "prefill" -> "pdtop-prefill"."""
    return f"pdtop-{key}"


def default_variables() -> dict[str, str]:
    return {variable(k): v for k, v in PDTOP_COLOURS.items()}


def theme_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    user = os.environ.get("PDTOP_THEMES_DIR") or str(Path.home() / ".config" / "pdtop" / "themes")
    return [here.parent / "themes", here.parent.parent / "themes", Path(user)]


def theme_from_mapping(data: Any, source: str = "<theme>") -> Theme:
    """Build a Theme from a parsed theme file; unknown keys and missing colours are errors."""
    if not isinstance(data, dict):
        raise ThemeError(f"{source}: a theme file must be a mapping, got {show(data)}")
    data = dict(data)
    colours = data.pop("pdtop", {}) or {}
    if not isinstance(colours, dict):
        raise ThemeError(f"{source}: `pdtop` must be a mapping of colours")
    if not isinstance(data.get("variables") or {}, dict):
        raise ThemeError(f"{source}: `variables` must be a mapping of CSS variables")
    unknown = [k for k in data if k not in _THEME_FIELDS]
    if unknown:
        raise ThemeError(f"{source}: unknown keys {_names(unknown)}; allowed: {sorted(_THEME_FIELDS | {'pdtop'})}")
    bad = [k for k in colours if k not in PDTOP_COLOURS]
    if bad:
        raise ThemeError(f"{source}: unknown pdtop colours {_names(bad)}; allowed: {sorted(PDTOP_COLOURS)}")
    for key in ("name", "primary"):
        if not data.get(key):
            raise ThemeError(f"{source}: `{key}` is required")
    variables = {**default_variables(), **{variable(k): str(v) for k, v in colours.items()}}
    variables.update(data.pop("variables", {}) or {})
    try:
        return Theme(variables=variables, **data)
    except TypeError as exc:  # pragma: no cover - guarded by the key check above
        raise ThemeError(f"{source}: {exc}") from exc


def _names(keys: list[Any]) -> str:
    """Keys from a file, as an error line names them: each shortened, at most five."""
    shown = [show_key(k) for k in keys[:5]]
    return f"[{', '.join(shown)}{f', and {len(keys) - 5} more' if len(keys) > 5 else ''}]"


def load_theme_file(path: Path) -> Theme:
    try:
        data = read_yaml(path)
    except OSError as exc:
        raise ThemeError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except YamlError as exc:
        raise ThemeError(f"{path}: {exc}") from None
    return theme_from_mapping(data, str(path))


def load_themes(dirs: list[Path] | None = None) -> dict[str, Theme]:
    """Every theme found in `dirs` (default: `theme_dirs()`), by name."""
    themes: dict[str, Theme] = {}
    for directory in theme_dirs() if dirs is None else dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.y*ml")):
            theme = load_theme_file(path)
            themes[theme.name] = theme
    return themes
