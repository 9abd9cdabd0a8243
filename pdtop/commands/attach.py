"""Attach the dashboard to a running `pdtop serve` (live, with controls if you have the token), or to
any serving engine's Prometheus `/metrics` page: vLLM, SGLang (with --enable-metrics) or `pdtop serve
--api-port`.

The URL is the one `pdtop serve` prints (ws://HOST:PORT); one without a host or with a bad port is
refused in one line before anything starts, and a server that answers plain HTTP is named as such
(http:// reads a /metrics page). Without the server's token,
or with --readonly, the dashboard only watches: every control is hidden and refused.
The connection is retried with backoff when the server goes away, and the header says so.

An http:// URL is read every --interval seconds (default 1) at HOST:PORT/metrics; the engine is told
by its metric names, and --model-name picks one model when the server serves several. Running and
waiting requests, KV use, TTFT / ITL / E2E percentiles over the last 30 s and token rates fill the
panels; what the server does not publish says "not exposed by this engine". Nothing can be steered
through /metrics: the dashboard is read-only. --token is sent as `Authorization: Bearer TOKEN`.

With --sglang-log FILE (or - for standard input) an SGLang server's log is followed: its Decode/Prefill
batch lines give running and waiting requests, KV use and throughput where /metrics lacks them (SGLang
without --enable-metrics: the log alone, with no URL or with the server's), and a pdmux server's
start-up line gives the levels, each 'Adjusting stream groups' line (SGLang's --log-level debug) the
level in force. --pdmux-config FILE (the server's YAML; with --gpu when there is no log) gives the
levels, and the level SGLang would pick for the scraped batch, shown as inferred.

Several http:// URLs (or --prefill URL / --decode URL, as sglang_router takes them) watch a fleet:
one row per server with its role, figures and address, the KV-transfer panel and the prefill:decode
balance in words; Enter opens a server's own view, Escape returns. An SGLang Model Gateway's address
gives its workers (its GET /workers listing).

Examples:
  pdtop attach ws://127.0.0.1:8765 --token "$TOKEN"
  PDTOP_TOKEN=... pdtop attach ws://gpu-box:8765
  pdtop attach ws://127.0.0.1:8765 --readonly --theme pdtop-light
  pdtop attach http://gpu-box:8000
  pdtop attach http://gpu-box:30000 --model-name meta-llama/Llama-3.1-8B-Instruct --interval 2
  pdtop attach http://gpu-box:30000 --sglang-log sglang.log
  pdtop attach --sglang-log sglang.log                        # SGLang without --enable-metrics
  python -m sglang.launch_server ... 2>&1 | pdtop attach http://127.0.0.1:30000 --sglang-log -
  pdtop attach http://gpu-box:30000 --pdmux-config pdmux.yaml --gpu H100
  pdtop attach --prefill http://p1:30000 8998 --decode http://d1:30001 --decode http://d2:30001
  pdtop attach http://router:30000
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from pdtop.commands._scrape import (
    add_fleet_arguments,
    add_scrape_arguments,
    check_scrape_arguments,
    fleet_servers,
    is_http,
    make_fleet,
    make_split,
)
from pdtop.commands.common import fail
from pdtop.ui.cli_args import DEFAULT_INTERVAL_S, add_ui_arguments

if TYPE_CHECKING:
    from pdtop.telemetry.sources.source import Source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_fleet_arguments(parser, "watch")
    parser.add_argument("--token", default=os.environ.get("PDTOP_TOKEN"),
                        help="ws://: the server's control token; http://: sent as `Authorization: Bearer TOKEN` "
                             "(default: $PDTOP_TOKEN)")
    parser.add_argument("--readonly", action="store_true", help="watch only: hide and refuse every control")
    add_scrape_arguments(parser, interval=False)
    add_ui_arguments(parser, interval_help="ws://: seconds between screen refreshes, 0.02 to 10 (default "
                                           f"{DEFAULT_INTERVAL_S:g}); http://: seconds between reads of /metrics "
                                           "(default 1)")
    parser.set_defaults(interval=None)


def make_source(args: argparse.Namespace, log_fd: int | None = None) -> Source:
    """The source for the URL; `args.interval` becomes the screen's refresh (for http://, the --interval
    given is the read's, default 1 s, and the screen keeps its default: it repaints when a read changed
    something). ValueError for bad options or URL."""
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.telemetry.sources.prometheus import PrometheusSource

    servers = fleet_servers(args)
    problem = check_scrape_arguments(args)
    if problem:
        raise ValueError(problem)
    fleet = make_fleet(args, servers, probe=log_fd is None)
    if fleet is not None:
        args.interval = DEFAULT_INTERVAL_S
        return fleet
    if args.url is not None and not is_http(args.url) and not args.url.startswith(("ws://", "wss://")):
        raise ValueError(f"not a ws:// or http:// URL: {args.url!r} (ws://HOST:PORT for pdtop serve, "
                         "http://HOST:PORT for a /metrics page)")
    if args.url is None or is_http(args.url):
        source: Source = PrometheusSource(args.url, token=args.token, interval=args.interval,
                                          model_name=args.model_name, split=make_split(args, log_fd))
        args.interval = DEFAULT_INTERVAL_S
        return source
    args.interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    return LiveSource(args.url, token=args.token, readonly=args.readonly)


def run(args: argparse.Namespace) -> int:
    from pdtop.ui.launch import run_dashboard

    try:
        piped = getattr(args, "sglang_log", None) == "-" and not args.more_urls
        log_fd = _take_piped_log() if piped and (args.url is None or is_http(args.url)) else None
        source = make_source(args, log_fd)
    except ValueError as exc:
        return fail("attach", exc)
    return run_dashboard(source, args, "attach")


def _take_piped_log() -> int:
    """`--sglang-log -`: the piped log moves to a descriptor of its own and the terminal becomes standard
    input again, for the dashboard's keys. ValueError when stdin is no pipe or there is no terminal."""
    if sys.stdin is None or sys.stdin.isatty():
        raise ValueError("--sglang-log - reads the log from standard input: pipe the server's output in "
                         "(... 2>&1 | pdtop attach URL --sglang-log -)")
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
    except OSError as exc:
        raise ValueError(f"--sglang-log -: the dashboard needs a terminal for its keys (/dev/tty: "
                         f"{exc.strerror or exc})") from None
    log_fd = os.dup(0)
    os.dup2(tty, 0)
    os.close(tty)
    return log_fd
