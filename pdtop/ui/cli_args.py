"""Command-line options shared by `pdtop dashboard`, `attach` and `replay` (imports nothing heavy)."""
from __future__ import annotations

import argparse


def add_ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--theme", metavar="NAME",
                        help="dashboard theme: pdtop-dark (default), pdtop-light, pdtop-amber, pdtop-ocean, "
                             "a file's name from ~/.config/pdtop/themes, or a Textual theme")
    parser.add_argument("--slo-ms", type=float, metavar="MS", help="draw an ITL SLO line at MS milliseconds (key s)")
