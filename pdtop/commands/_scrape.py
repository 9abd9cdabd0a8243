"""The options of the commands that read a server's Prometheus /metrics over http:// (`attach`, `record`)."""
from __future__ import annotations

import argparse
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdtop.telemetry.sources.sglang_split import SglangSplit


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
    parser.add_argument("--sglang-log", metavar="FILE|-",
                        help="http:// URLs: follow an SGLang pdmux server's log for its split (its start-up line and, "
                             "with SGLang's --log-level debug, each 'Adjusting stream groups' line); - reads standard "
                             "input, as in `python -m sglang.launch_server ... 2>&1 | pdtop attach URL --sglang-log -`")
    parser.add_argument("--pdmux-config", metavar="FILE",
                        help="http:// URLs: the SGLang server's --pdmux-config-path YAML: its levels without a log, "
                             "and the level SGLang would pick for the scraped batch, shown as inferred")
    parser.add_argument("--gpu", metavar="NAME",
                        help="with --pdmux-config and no log: the server's GPU, for its SM count (H100, H200, A100, "
                             "H20 or custom:sms=N,cc=9.0,...)")


def check_scrape_arguments(args: argparse.Namespace) -> str | None:
    """None if the scrape options can be used with this URL, else why not; sets the default interval."""
    if not is_http(args.url):
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
