"""Attach the dashboard to a running `pdtop serve` (live, with controls if you have the token), or to
any serving engine's Prometheus `/metrics` page: vLLM, SGLang (with --enable-metrics) or `pdtop serve
--api-port`.

The URL is the one `pdtop serve` prints (ws://HOST:PORT). Without the server's token,
or with --readonly, the dashboard only watches: every control is hidden and refused.
The connection is retried with backoff when the server goes away, and the header says so.

An http:// URL is read every --interval seconds (default 1) at HOST:PORT/metrics; the engine is told
by its metric names, and --model-name picks one model when the server serves several. Running and
waiting requests, KV use, TTFT / ITL / E2E percentiles over the last 30 s and token rates fill the
panels; what the server does not publish says "not exposed by this engine". Nothing can be steered
through /metrics: the dashboard is read-only. --token is sent as `Authorization: Bearer TOKEN`.

Examples:
  pdtop attach ws://127.0.0.1:8765 --token "$TOKEN"
  PDTOP_TOKEN=... pdtop attach ws://gpu-box:8765
  pdtop attach ws://127.0.0.1:8765 --readonly --theme pdtop-light
  pdtop attach http://gpu-box:8000
  pdtop attach http://gpu-box:30000 --model-name meta-llama/Llama-3.1-8B-Instruct --interval 2
"""
from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from pdtop.commands._common import fail
from pdtop.commands._scrape import add_scrape_arguments, check_scrape_arguments, is_http
from pdtop.ui.cli_args import DEFAULT_INTERVAL_S, add_ui_arguments

if TYPE_CHECKING:
    from pdtop.telemetry.sources.source import Source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", metavar="URL", help="ws://HOST:PORT (pdtop serve) or http://HOST:PORT (a /metrics page)")
    parser.add_argument("--token", default=os.environ.get("PDTOP_TOKEN"),
                        help="ws://: the server's control token; http://: sent as `Authorization: Bearer TOKEN` "
                             "(default: $PDTOP_TOKEN)")
    parser.add_argument("--readonly", action="store_true", help="watch only: hide and refuse every control")
    add_scrape_arguments(parser, interval=False)
    add_ui_arguments(parser, interval_help="ws://: seconds between screen refreshes, 0.02 to 10 (default "
                                           f"{DEFAULT_INTERVAL_S:g}); http://: seconds between reads of /metrics "
                                           "(default 1)")
    parser.set_defaults(interval=None)


def make_source(args: argparse.Namespace) -> Source:
    """The source for the URL; `args.interval` becomes the screen's refresh (for http://, the --interval
    given is the read's, default 1 s, and the screen keeps its default: it repaints when a read changed
    something). ValueError for bad options or URL."""
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.telemetry.sources.prometheus import PrometheusSource

    problem = check_scrape_arguments(args)
    if problem:
        raise ValueError(problem)
    if is_http(args.url):
        source: Source = PrometheusSource(args.url, token=args.token, interval=args.interval,
                                          model_name=args.model_name)
        args.interval = DEFAULT_INTERVAL_S
        return source
    args.interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    return LiveSource(args.url, token=args.token, readonly=args.readonly)


def run(args: argparse.Namespace) -> int:
    from pdtop.ui.launch import run_dashboard

    try:
        source = make_source(args)
    except ValueError as exc:
        return fail("attach", exc)
    return run_dashboard(source, args, "attach")
