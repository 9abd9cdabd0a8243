"""Run the dashboard on a source, with clear errors for bad options (used by the commands)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pdtop.telemetry.sources.source import Source
from pdtop.ui.themes import DEFAULT_THEME, ThemeError, load_themes

if TYPE_CHECKING:
    from pdtop.ui.app import PdtopApp


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


def check_ui_options(args: argparse.Namespace) -> str | None:
    """None if the dashboard options (--theme, --slo-ms, --interval) can be used, else why not."""
    if args.slo_ms is not None and not args.slo_ms > 0:
        return f"--slo-ms must be positive, got {args.slo_ms:g}"
    if not 0.02 <= args.interval <= 10:
        return f"--interval must be 0.02 to 10 seconds, got {args.interval:g}"
    return check_theme(args.theme)


def make_app(source: Source, args: argparse.Namespace) -> PdtopApp:
    from pdtop.ui.app import PdtopApp

    return PdtopApp(source, theme=args.theme, slo_ms=args.slo_ms, interval_s=args.interval)


def exit_code(app: PdtopApp, prog: str) -> int:
    """After `app.run()`: 0, or 1 when it crashed (Textual printed the traceback) or its event source failed."""
    if app.return_code:
        print(f"pdtop {prog}: error: the dashboard stopped on an error (above)", file=sys.stderr)
        return app.return_code
    if app.source_error:
        print(f"pdtop {prog}: error: {app.source_error}", file=sys.stderr)
        return 1
    return 0


def run_dashboard(source: Source, args: argparse.Namespace, prog: str) -> int:
    """Run the app until the operator quits: 2 for bad options, else `exit_code`."""
    problem = check_ui_options(args)
    if problem:
        print(f"pdtop {prog}: error: {problem}", file=sys.stderr)
        return 2
    app = make_app(source, args)
    app.run()
    return exit_code(app, prog)
