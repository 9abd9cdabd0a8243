"""The `pdtop` command line: one table of subcommands, each in its own module.

Each subcommand's module (in `pdtop.commands`, or a feature's own `cli` module: `pdtop.tune.cli`,
`pdtop.bench.cli`) has `add_arguments(parser)` and `run(args) -> int`, its docstring is the
subcommand's description, and it keeps heavy imports (torch, textual) inside `run`, so `--help`
stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from pdtop import __version__

# (name, module, one-line help). Order is the order `pdtop --help` lists them.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("dashboard", "pdtop.commands.dashboard", "start the embedded engine and watch it in the dashboard (the default)"),
    ("attach", "pdtop.commands.attach", "attach the dashboard to a running `pdtop serve`"),
    ("replay", "pdtop.commands.replay", "play a recording in the dashboard"),
    ("serve", "pdtop.commands.serve", "run the engine with its workload and a websocket telemetry/control server"),
    ("record", "pdtop.commands.record", "record a running server's event stream to an NDJSON file"),
    ("generate", "pdtop.commands.generate", "complete one prompt with the embedded model"),
    ("bench", "pdtop.bench.cli", "compare scheduling policies on a fixed, seeded workload"),
    ("tune", "pdtop.tune.cli",
     "find the pdmux configuration that meets ITL/TTFT SLOs with the best goodput; write SGLang's YAML"),
    ("levels", "pdtop.commands.levels", "print the split levels (stream groups) for a device"),
    ("estimate", "pdtop.commands.estimate",
     "print the seed's roofline comparison of prefill-first, chunked, PD multiplexing and PD disaggregation"),
    ("kv", "pdtop.commands.kv", "print a model's KV cache: bytes a token, a request's, and how many requests fit"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdtop",
        description="pdtop: `top` for PD multiplexing. Runs a small LLM engine that splits a device "
        "between prefill and decode, streams every scheduler round over websockets, and shows it "
        "live in a terminal dashboard. With no subcommand, starts the dashboard on the embedded engine "
        "with a demo workload (`pdtop dashboard --help` describes it).",
    )
    parser.add_argument("--version", action="version", version=f"pdtop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if (not argv or argv[0].startswith("-")) and not {"-h", "--help", "--version"} & set(argv):
        argv = ["dashboard", *argv]  # `pdtop --device sim:H100` means the dashboard
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage and name, not the top level's (`pdtop kv --bogus`)
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # Ctrl+C: one line, then the shell's 128 + SIGINT
        print(f"pdtop {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # `pdtop levels | head`: the reader left; stop quietly, as a tool killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 128 + signal.SIGPIPE
