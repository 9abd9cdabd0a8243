"""Attach the dashboard to a running `pdtop serve` (live, with controls if you have the token).

The URL is the one `pdtop serve` prints (ws://HOST:PORT). Without the server's token,
or with --readonly, the dashboard only watches: every control is hidden and refused.
The connection is retried with backoff when the server goes away, and the header says so.

Examples:
  pdtop attach ws://127.0.0.1:8765 --token "$TOKEN"
  PDTOP_TOKEN=... pdtop attach ws://gpu-box:8765
  pdtop attach ws://127.0.0.1:8765 --readonly --theme pdtop-light
"""
from __future__ import annotations

import argparse
import os

from pdtop.commands._common import fail
from pdtop.ui.cli_args import add_ui_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", metavar="ws://HOST:PORT", help="the server's websocket URL")
    parser.add_argument("--token", default=os.environ.get("PDTOP_TOKEN"),
                        help="the server's control token (default: $PDTOP_TOKEN)")
    parser.add_argument("--readonly", action="store_true", help="watch only: hide and refuse every control")
    add_ui_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.ui.launch import run_dashboard

    try:
        source = LiveSource(args.url, token=args.token, readonly=args.readonly)
    except ValueError as exc:
        return fail("attach", exc)
    return run_dashboard(source, args, "attach")
