"""Command-line options shared by `pdtop dashboard`, `attach` and `replay` (imports nothing heavy)."""
from __future__ import annotations

import argparse

DEFAULT_INTERVAL_S = 0.1


def add_ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--theme", metavar="NAME",
                        help="dashboard theme: pdtop-dark (default), pdtop-light, pdtop-amber, pdtop-ocean, "
                             "a file's name from ~/.config/pdtop/themes, or a Textual theme")
    parser.add_argument("--slo-ms", type=float, metavar="MS", help="draw an ITL SLO line at MS milliseconds (key s)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help=f"seconds between screen refreshes, 0.02 to 10 (default {DEFAULT_INTERVAL_S:g}); "
                             "events are taken in between, and f freezes the screen")
