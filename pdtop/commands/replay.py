"""Play a recording in the dashboard: the same panels as live, with play/pause, step, seek, speed.

Recordings come from `pdtop serve --record FILE`, `pdtop record`, or the dashboard's
record key (R). Keys: space play/pause, . step one round, left/right seek 5 s, g go to
a time, < > speed (0.25x to 16x). Nothing can be sent to an engine from a replay.

Examples:
  pdtop replay run.ndjson.gz
  pdtop replay run.ndjson --speed 4 --paused
"""
from __future__ import annotations

import argparse

from pdtop.commands.common import fail
from pdtop.ui.cli_args import add_ui_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("file", metavar="FILE", help="a pdtop recording (NDJSON, optionally .gz)")
    parser.add_argument("--speed", type=float, default=1.0, help="playback speed, 0.25 to 16 (default 1)")
    parser.add_argument("--paused", action="store_true", help="start paused (space plays, . steps)")
    add_ui_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pdtop.telemetry.recording.recorder import RecordingError
    from pdtop.telemetry.sources.replay import ReplaySource
    from pdtop.ui.launch import run_dashboard

    try:
        source = ReplaySource(args.file, speed=args.speed)
    except (RecordingError, ValueError, OSError) as exc:
        return fail("replay", exc)
    if args.paused:
        source.pause()
    return run_dashboard(source, args, "replay")
