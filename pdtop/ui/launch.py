"""Run the dashboard on a source, with clear errors for bad options (used by the commands)."""
from __future__ import annotations

import argparse
import sys

from pdtop.telemetry.sources.source import Source
from pdtop.ui.themes import DEFAULT_THEME, ThemeError, load_themes


def check_theme(name: str | None) -> str | None:
    """None if `name` can be used (a pdtop theme file or a Textual built-in), else why not."""
    if not name or name == DEFAULT_THEME:
        return None
    try:
        themes = load_themes()
    except ThemeError as exc:
        return str(exc)
    from textual.theme import BUILTIN_THEMES

    if name in themes or name in BUILTIN_THEMES:
        return None
    return f"unknown theme {name!r}; known: {', '.join(sorted(themes) + sorted(BUILTIN_THEMES))}"


def run_dashboard(source: Source, args: argparse.Namespace, prog: str) -> int:
    """Run the app until the operator quits; 2 for bad options, 0 otherwise."""
    problem = check_theme(args.theme)
    slo = args.slo_ms
    if slo is not None and slo <= 0:
        problem = f"--slo-ms must be positive, got {slo:g}"
    if problem:
        print(f"pdtop {prog}: error: {problem}", file=sys.stderr)
        return 2
    from pdtop.ui.app import PdtopApp

    app = PdtopApp(source, theme=args.theme, slo_ms=slo)
    app.run()
    if app.source_error:
        print(f"pdtop {prog}: {app.source_error}", file=sys.stderr)
        return 1
    return 0
