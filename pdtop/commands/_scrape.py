"""The options of the commands that read a server's Prometheus /metrics over http:// (`attach`, `record`)."""
from __future__ import annotations

import argparse
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdtop.telemetry.sources.fleet import FleetSource
    from pdtop.telemetry.sources.sglang_split import SglangSplit


def is_http(url: str | None) -> bool:
    return url is not None and url.startswith(("http://", "https://"))


def add_scrape_arguments(parser: argparse.ArgumentParser, interval: bool = True) -> None:
    """--model-name, and --interval unless the command has its own (`attach`: the dashboard's)."""
    if interval:
        parser.add_argument("--interval", type=float, default=None, metavar="S",
                            help="http:// URLs: seconds between reads of /metrics (default 1)")
    parser.add_argument("--model-name", metavar="NAME",
                        help="http:// URLs: the model to show when the server serves several (its `model_name` "
                             "label; default: the first on the page)")
    parser.add_argument("--sglang-log", metavar="FILE|-",
                        help="follow an SGLang server's log: its Decode/Prefill batch lines give running, waiting, "
                             "KV use and throughput where /metrics lacks them (SGLang without --enable-metrics: give "
                             "no URL, or its URL), and a pdmux server's start-up and 'Adjusting stream groups' lines "
                             "(with --log-level debug) its split; - reads standard input, as in `python -m "
                             "sglang.launch_server ... 2>&1 | pdtop attach URL --sglang-log -`")
    parser.add_argument("--pdmux-config", metavar="FILE",
                        help="http:// URLs: the SGLang server's --pdmux-config-path YAML: its levels without a log, "
                             "and the level SGLang would pick for the scraped batch, shown as inferred")
    parser.add_argument("--gpu", metavar="NAME",
                        help="with --pdmux-config and no log: the server's GPU, for its SM count (H100, H200, A100, "
                             "H20 or custom:sms=N,cc=9.0,...)")


def check_scrape_arguments(args: argparse.Namespace) -> str | None:
    """None if the scrape options can be used with this URL (or with no URL and an SGLang log), else why
    not; sets the default interval."""
    if args.url is not None and not is_http(args.url):
        for flag in ("model_name", "sglang_log", "pdmux_config", "gpu"):
            if getattr(args, flag, None) is not None:
                return f"--{flag.replace('_', '-')} is for http:// URLs (a /metrics page)"
        return None
    if args.interval is None:
        args.interval = 1.0
    if not 0.05 <= args.interval <= 3600:
        return f"--interval must be 0.05 to 3600 seconds, got {args.interval:g}"
    return None


def make_split(args: argparse.Namespace, log_fd: int | None = None) -> SglangSplit | None:
    """The split source of --sglang-log / --pdmux-config / --gpu, or None without them; ValueError (one
    line) for a log that cannot be followed, a bad YAML or GPU. `log_fd`: the pipe for `--sglang-log -`."""
    from pdtop.engine.errors import EngineError
    from pdtop.engine.roofline.gpu_specs import parse_gpu
    from pdtop.engine.scheduling.pdmux_config import load_pdmux_config
    from pdtop.engine.scheduling.splits import SplitTable
    from pdtop.telemetry.sources.log_follow import LogFollower
    from pdtop.telemetry.sources.sglang_split import SglangSplit

    log, config_path, gpu = getattr(args, "sglang_log", None), getattr(args, "pdmux_config", None), args.gpu
    if log is None and config_path is None:
        if gpu is not None:
            raise ValueError("--gpu is for --pdmux-config (the SM count of its levels)")
        return None
    follower = None
    if log is not None:
        if log == "-":
            follower = LogFollower(fd=0 if log_fd is None else log_fd)
        else:
            try:
                mode = os.stat(log).st_mode
            except OSError as exc:
                raise ValueError(f"--sglang-log {log}: {exc.strerror or exc}") from None
            if stat.S_ISDIR(mode):
                raise ValueError(f"--sglang-log {log}: a directory, not a log file")
            follower = LogFollower(path=log)
    try:
        config = load_pdmux_config(config_path) if config_path is not None else None
        spec = parse_gpu(gpu) if gpu is not None else None
        if config is not None and follower is None:
            if spec is None:
                raise ValueError("--pdmux-config without --sglang-log needs --gpu NAME: the levels depend on the "
                                 "GPU's SM count")
            SplitTable.for_gpu(spec.sms, spec.cc_major, config)  # the divisions must fit the GPU
    except EngineError as exc:
        raise ValueError(str(exc)) from None
    return SglangSplit(follower, config, spec.sms if spec else None, spec.cc_major if spec else 9)


def add_fleet_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """URL... (several: a fleet that the command `verb`s), and sglang_router's --prefill URL
    [BOOTSTRAP_PORT] / --decode URL."""
    parser.add_argument("url", metavar="URL", nargs="?",
                        help="ws://HOST:PORT (pdtop serve) or http://HOST:PORT (a /metrics page); several http:// "
                             f"URLs, or an SGLang Model Gateway's address, {verb} a fleet")
    parser.add_argument("more_urls", metavar="URL", nargs="*", help="more http:// URLs: a fleet")
    parser.add_argument("--prefill", nargs="+", action="append", metavar=("URL", "BOOTSTRAP_PORT"),
                        help="http:// URLs: a prefill server of a disaggregated fleet, as sglang_router takes it "
                             "(URL [BOOTSTRAP_PORT]; the port is not needed here); repeat for each")
    parser.add_argument("--decode", action="append", metavar="URL",
                        help="http:// URLs: a decode server of a disaggregated fleet; repeat for each")


def fleet_servers(args: argparse.Namespace) -> list[tuple[str, str | None]] | None:
    """The fleet's (URL, role) when several servers are given, else None (and `args.url` is the one URL).
    ValueError (one line) for a fleet that cannot be: a ws:// URL in it, a log or config option, none."""
    urls = ([args.url] if args.url else []) + list(getattr(args, "more_urls", None) or [])
    prefill = [p[0] for p in (getattr(args, "prefill", None) or [])]
    decode = list(getattr(args, "decode", None) or [])
    for p in getattr(args, "prefill", None) or []:
        if len(p) > 2 or (len(p) == 2 and not p[1].isdigit()):
            raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(p)!r}")
    if not urls and not prefill and not decode:
        if getattr(args, "sglang_log", None) is not None:  # SGLang's log alone
            args.url = None
            return None
        raise ValueError("give a URL: ws://HOST:PORT (pdtop serve) or http://HOST:PORT (a /metrics page), or "
                         "--sglang-log FILE (an SGLang server's log alone)")
    if len(urls) == 1 and not prefill and not decode:
        args.url = urls[0]
        return None
    servers: list[tuple[str, str | None]] = [(u, None) for u in urls]
    servers += [(u, "prefill") for u in prefill] + [(u, "decode") for u in decode]
    for url, _ in servers:
        if not is_http(url):
            raise ValueError(f"a fleet is read over http:// (/metrics pages): {url!r}")
    for flag in ("sglang_log", "pdmux_config", "model_name"):
        if getattr(args, flag, None) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} is for one server, not a fleet")
    args.url = servers[0][0]
    return servers


def make_fleet(args: argparse.Namespace, servers: list[tuple[str, str | None]] | None,
               probe: bool = True) -> FleetSource | None:
    """The FleetSource for `servers`, or for a single http:// URL that is an SGLang Model Gateway (its
    worker listing answers); None for a single server. ValueError for a bad URL."""
    from pdtop.telemetry.sources.fleet import FleetSource
    from pdtop.telemetry.sources.router import probe_router

    interval = args.interval if args.interval is not None else 1.0
    if servers is not None:
        return FleetSource(servers, token=args.token, interval=interval)
    if args.url is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(args.url)
    if not probe or not is_http(args.url) or parts.path not in ("", "/") or \
            getattr(args, "sglang_log", None) or getattr(args, "pdmux_config", None):
        return None
    workers = probe_router(args.url, args.token)
    if workers is None:
        return None
    return FleetSource([], router=args.url, token=args.token, interval=interval)
