"""The options of the commands that read a server's Prometheus /metrics over http:// (`attach`, `record`)."""
from __future__ import annotations

import argparse


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def add_scrape_arguments(parser: argparse.ArgumentParser, interval: bool = True) -> None:
    """--model-name, and --interval unless the command has its own (`attach`: the dashboard's)."""
    if interval:
        parser.add_argument("--interval", type=float, default=None, metavar="S",
                            help="http:// URLs: seconds between reads of /metrics (default 1)")
    parser.add_argument("--model-name", metavar="NAME",
                        help="http:// URLs: the model to show when the server serves several (its `model_name` "
                             "label; default: the first on the page)")


def check_scrape_arguments(args: argparse.Namespace) -> str | None:
    """None if the scrape options can be used with this URL, else why not; sets the default interval."""
    if not is_http(args.url):
        if args.model_name is not None:
            return "--model-name is for http:// URLs (a /metrics page)"
        return None
    if args.interval is None:
        args.interval = 1.0
    if not 0.05 <= args.interval <= 3600:
        return f"--interval must be 0.05 to 3600 seconds, got {args.interval:g}"
    return None
