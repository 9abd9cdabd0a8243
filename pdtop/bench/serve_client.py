"""`pdtop bench --url`: `vllm bench serve`'s client, with vLLM 0.33.0's options, figures and result file.

The options (`add_arguments`), what is wrong with them (`check`, one line each, before anything is
sent), the run (`run`: the local tokenizer and the prompts, the served model, then the load of
`bench/loadgen.py`, a progress bar on stderr) and its report (vLLM's table or pdtop's `--json` object;
vLLM's result JSON with `--save-result` or `--append-result`). The server is named by `--url`
(`http://HOST:PORT`, with or without `/v1`), vLLM's `--base-url`, or `--host`/`--port` (vLLM's
defaults 127.0.0.1 and 8000); requests go to it plus `--endpoint`. An API key comes from
$OPENAI_API_KEY, as vLLM's; `--header` adds to it and overrides it. Where the result file goes is
checked before the first request: a run is not lost to a path it cannot write. Everything a
server said that reaches the terminal has its control characters made visible. docs/bench_url.md
says, point by point, which vLLM release each behaviour follows.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import stat
import sys
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pdtop.bench.datasets import add_dataset_arguments, dataset_problem, dataset_prompts
from pdtop.bench.openai_request import BACKENDS, STALL_S, server_base
from pdtop.bench.vllm_result import DEFAULT_PERCENTILE_METRICS, PERCENTILE_METRICS
from pdtop.commands.common import INPUT_ERRORS, fail
from pdtop.json_text import json_text
from pdtop.visible import visible

if TYPE_CHECKING:
    from pdtop.bench.loadgen import LoadRun, LoadSpec, Prompt
    from pdtop.bench.openai_request import RequestResult
    from pdtop.engine.model.tokenizer import Tokenizer

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110's token)
SAMPLING = ("temperature", "top_p", "top_k", "min_p")


def add_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The load generator's options, as a group of `pdtop bench`'s; returns them (`bench` refuses them
    without a server to send to)."""
    g = p.add_argument_group("load generator (with --url, --base-url or --host/--port; vllm bench serve 0.33's "
                             "options)")
    first = len(p._actions)
    g.add_argument("--url", metavar="http://HOST:PORT",
                   help="send the load to this OpenAI-compatible server (with or without /v1) instead of comparing "
                        "policies; --model then names the served model (default: the first it lists)")
    g.add_argument("--base-url", metavar="http://HOST:PORT", help="vLLM's name for --url")
    g.add_argument("--host", help="the server's host, with --port (vLLM's default 127.0.0.1)")
    g.add_argument("--port", type=int, help="the server's port, with --host (vLLM's default 8000)")
    g.add_argument("--endpoint", default="/v1/completions",
                   help="the path requests go to (default /v1/completions; openai-chat: /v1/chat/completions)")
    g.add_argument("--backend", choices=tuple(BACKENDS), default="openai",
                   help="openai and vllm: streaming completions; openai-chat: streaming chat completions "
                        "(default openai)")
    g.add_argument("--header", nargs="*", metavar="KEY=VALUE", help="headers sent with every request")
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second; inf sends all at once (default inf)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps between arrivals: 1 is Poisson, < 1 burstier, > 1 more even "
                        "(default 1; only with a finite --request-rate or a ramp-up)")
    g.add_argument("--ramp-up-strategy", choices=("linear", "exponential"),
                   help="raise the rate from --ramp-up-start-rps to --ramp-up-end-rps over the requests "
                        "(instead of --request-rate)")
    g.add_argument("--ramp-up-start-rps", type=int, help="the ramp-up's first rate")
    g.add_argument("--ramp-up-end-rps", type=int, help="the ramp-up's last rate")
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    g.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="do not send the first prompt once, uncounted, before the clock starts")
    g.add_argument("--ready-check-timeout-sec", type=int, default=None, metavar="S",
                   help="instead, send it every 5 s until it succeeds, for at most S seconds (0: not at all)")
    g.add_argument("--num-warmups", type=int, default=0, metavar="N",
                   help="then send it N times more, uncounted (default 0)")
    add_dataset_arguments(g)
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    g.add_argument("--random-output-len", type=int, default=128, help="max_tokens per request (default 128)")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)] (default 0: fixed)")
    g.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM's ignore_eos)")
    g.add_argument("--temperature", type=float, help="sampling temperature (default 0: greedy)")
    g.add_argument("--top-p", type=float, help="top-p sampling (default: the server's)")
    g.add_argument("--top-k", type=int, help="top-k sampling (default: the server's)")
    g.add_argument("--min-p", type=float, help="min-p sampling (default: the server's)")
    g.add_argument("--goodput", nargs="+", metavar="METRIC:MS", default=[],
                   help="SLOs for goodput: ttft:MS, tpot:MS, e2el:MS")
    g.add_argument("--percentile-metrics", default=DEFAULT_PERCENTILE_METRICS,
                   help=f"metrics to report statistics of, from {','.join(PERCENTILE_METRICS)} (the client queue "
                        f"two need --max-concurrency; default {DEFAULT_PERCENTILE_METRICS})")
    g.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default 99)")
    g.add_argument("--save-result", action="store_true", help="write vLLM's result JSON")
    g.add_argument("--save-detailed", action="store_true",
                   help="with the per-request arrays (input_lens, output_lens, ttfts, itls, generated_texts, ...)")
    g.add_argument("--append-result", action="store_true",
                   help="add the result to the file as one more line instead of replacing it")
    g.add_argument("--metadata", nargs="*", metavar="KEY=VALUE", help="keys to add to the result JSON")
    g.add_argument("--result-dir", metavar="DIR", help="where to write it (default: the current directory)")
    g.add_argument("--result-filename", metavar="NAME",
                   help="its name (default: vLLM's {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json)")
    g.add_argument("--label", help="the result's label and file name prefix (default: the backend)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="a GGUF or a Hugging Face tokenizer folder that cuts and counts the prompts "
                        "(default SmolLM2's)")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    g.add_argument("--stall-timeout-sec", type=float, default=STALL_S, metavar="S",
                   help=f"a request whose stream, once it has sent a token, is silent for S seconds fails "
                        f"(pdtop's; default {STALL_S:g}; the first token may take vLLM's 6 h)")
    return p._actions[first:]


def url_mode(args: argparse.Namespace) -> bool:
    """A server is named: `bench` is the load generator."""
    return bool(args.url or args.base_url) or args.host is not None or args.port is not None


def _pairs(items: list[str] | None, flag: str) -> tuple[list[tuple[str, str]], str | None]:
    """KEY=VALUE items as vLLM splits them (at the first `=`, both sides stripped), or what is wrong."""
    pairs = []
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            return [], f"{flag} takes KEY=VALUE, got {visible(item)!r}"
        pairs.append((key.strip(), value.strip()))
    return pairs, None


def _check_address(args: argparse.Namespace) -> str | None:
    named = [flag for flag, value in (("--url", args.url), ("--base-url", args.base_url)) if value]
    if len(named) > 1 or (named and (args.host is not None or args.port is not None)):
        return "name the server once: --url, --base-url, or --host/--port"
    if named:
        url = args.url or args.base_url
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  # ValueError for a port that is not one
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
                or parts.fragment:
            return f"{named[0]} must be http://HOST:PORT (or .../v1), got {visible(url)!r}"
    if args.port is not None and not 0 < args.port < 65536:
        return f"--port must be 1 to 65535, got {args.port}"
    if args.host is not None and (not args.host or not all(c.isalnum() or c in ".-:_[]%" for c in args.host)):
        return f"--host must be a host name or address, got {visible(args.host)!r}"
    if not args.endpoint.startswith("/"):
        return f"--endpoint is a path starting with /, got {visible(args.endpoint)!r}"
    if not args.endpoint.endswith(BACKENDS[args.backend]):  # vLLM 0.33's _validate_api_url
        return f"--backend {args.backend} sends to an --endpoint ending in {BACKENDS[args.backend]} (vLLM 0.33's rule)"
    headers, problem = _pairs(args.header, "--header")
    for key, value in headers:
        if not _TOKEN.fullmatch(key) or not all(" " <= c <= "~" for c in value):
            return (f"--header {visible(key)}: a header name is letters, digits and !#$%&'*+-.^_`|~, "
                    "its value printable ASCII")
    return problem


def _check_goodput(items: list[str]) -> str | None:
    """vLLM 0.33's check_goodput_args, one line each: the format, the name, the value."""
    from pdtop.bench.loadgen import SLO_METRICS

    for item in items:
        parts = item.split(":")
        if len(parts) != 2:
            return f"--goodput takes METRIC:MS, got {visible(item)!r}"
        name, ms = parts
        if name not in SLO_METRICS:
            return f"--goodput {visible(item)!r}: the metric must be one of {', '.join(SLO_METRICS)}"
        try:
            value = float(ms)
        except ValueError:
            value = math.nan
        if not value >= 0:
            return f"--goodput {visible(item)!r}: the value must be a number of milliseconds >= 0"
    return None


def _check_ramp_up(args: argparse.Namespace) -> str | None:
    """vLLM 0.33's main_async checks, and a first rate above 0 (vLLM asserts one for every request)."""
    start, end = args.ramp_up_start_rps, args.ramp_up_end_rps
    if args.ramp_up_strategy is None:
        return "--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy" if (start, end) != (None, None) \
            else None
    if args.request_rate != math.inf:
        return "--ramp-up-strategy sets the rate: leave --request-rate out"
    if start is None or end is None:
        return "--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps"
    if start <= 0 or end <= 0:
        return "--ramp-up-start-rps and --ramp-up-end-rps must be > 0"
    if start > end:
        return "--ramp-up-start-rps must not be above --ramp-up-end-rps"
    return None


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, if anything (one line)."""
    problem = _check_address(args) or _pairs(args.metadata, "--metadata")[1] or _check_ramp_up(args)
    if problem:
        return problem
    for name in ("random_input_len", "random_output_len", "max_concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    for name in ("num_warmups", "ready_check_timeout_sec"):
        value = getattr(args, name)
        if value is not None and value < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {value}"
    if not args.warmup and args.ready_check_timeout_sec:
        return "--no-warmup and --ready-check-timeout-sec: the ready check is a warm-up; give one"
    if not args.request_rate > 0:
        return f"--request-rate must be > 0 (or inf), got {args.request_rate}"
    if not args.burstiness > 0:
        return f"--burstiness must be > 0, got {args.burstiness}"
    if not 0 < args.stall_timeout_sec < math.inf:
        return f"--stall-timeout-sec must be > 0, got {args.stall_timeout_sec}"
    if not 0 <= args.random_range_ratio < 1:
        return f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}"
    for name in SAMPLING:
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):
            return f"--{name.replace('_', '-')} must be a finite number, got {value}"
    problem = dataset_problem(args)
    if problem:
        return problem
    metrics = args.percentile_metrics.split(",")
    if not all(m in PERCENTILE_METRICS for m in metrics):
        return (f"--percentile-metrics takes names from {','.join(PERCENTILE_METRICS)}, "
                f"got {visible(args.percentile_metrics)!r}")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    except ValueError:
        percentiles = [-1.0]
    if not all(0 < p <= 100 for p in percentiles):
        return f"--metric-percentiles takes numbers in (0, 100], got {visible(args.metric_percentiles)!r}"
    return _check_goodput(args.goodput)


def base_url(args: argparse.Namespace) -> str:
    """The server's base URL (no /v1), as vLLM's `--base-url` or `http://{host}:{port}`."""
    if args.url or args.base_url:
        return server_base(args.url or args.base_url)
    host = args.host or "127.0.0.1"
    if ":" in host and not host.startswith("["):  # vLLM's join_host_port: an IPv6 address in brackets
        host = f"[{host}]"
    return f"http://{host}:{args.port or 8000}"


def spec_of(args: argparse.Namespace) -> LoadSpec:
    from pdtop.bench.loadgen import LoadSpec

    goodput = {name: float(ms) for name, _, ms in (item.partition(":") for item in args.goodput)}
    sampling = {name: getattr(args, name) for name in SAMPLING if getattr(args, name) is not None}
    sampling.setdefault("temperature", 0.0)  # greedy unless asked: vLLM 0.33 leaves it to the server
    ramp = args.ramp_up_strategy and (args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)
    return LoadSpec(url=base_url(args), model=args.model, model_id=args.model, endpoint=args.endpoint,
                    backend=args.backend, num_prompts=args.num_prompts, request_rate=args.request_rate,
                    max_concurrency=args.max_concurrency, input_len=args.random_input_len,
                    output_len=args.random_output_len, range_ratio=args.random_range_ratio, seed=args.seed,
                    ignore_eos=args.ignore_eos, goodput=goodput, burstiness=args.burstiness, sampling=sampling,
                    warmup=args.warmup and args.ready_check_timeout_sec is None,
                    ready_check_timeout_s=args.ready_check_timeout_sec or 0, num_warmups=args.num_warmups,
                    ramp_up=ramp or None, stall_s=args.stall_timeout_sec)


def _prompts(args: argparse.Namespace, spec: LoadSpec, tokenizer: Tokenizer) -> list[Prompt]:
    from pdtop.bench.loadgen import make_prompts
    from pdtop.engine.scheduling.workload import corpus_text

    if args.dataset_name != "random":
        return list(dataset_prompts(args, tokenizer, spec.num_prompts, spec.seed))
    return list(make_prompts(spec, tokenizer.encode(corpus_text()), tokenizer.decode))


def _headers(args: argparse.Namespace) -> dict[str, str]:
    """$OPENAI_API_KEY's Authorization, then --header's (vLLM's _get_headers and extra_headers)."""
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(_pairs(args.header, "--header")[0])
    return headers


def unwritable(path: str) -> str | None:
    """Why the result could not be written to `path`, found by opening it for appending (and removing it
    again if it was not there): before the run, not after."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        return f"cannot write the result to {visible(path)}: {getattr(exc, 'strerror', None) or exc}"
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return f"cannot write the result to {visible(path)}: not a regular file"
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666))
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        return f"cannot write the result to {visible(path)}: {getattr(exc, 'strerror', None) or exc}"
    if st is None:
        os.unlink(path)
    return None


def _save(path: str, result: dict, append: bool) -> None:
    """vLLM's write: the whole file, or with --append-result one more JSON line."""
    with open(path, "a+" if append else "w", encoding="utf-8") as f:
        if append and f.tell() != 0:
            f.write("\n")
        json.dump(result, f)


def _fail(problem: str | BaseException) -> int:
    return fail("bench", visible(str(problem)))


async def _served(spec: LoadSpec, headers: dict[str, str]) -> tuple[str, str]:
    import httpx

    from pdtop.bench.openai_request import served_model

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), headers=headers) as client:
        return await served_model(client, spec.url)


def run(args: argparse.Namespace) -> int:
    import httpx

    from pdtop.bench.hf_tokenizer import load_tokenizer
    from pdtop.bench.loadgen import LoadRun, WarmupFailed, run_load
    from pdtop.bench.openai_request import ServerError
    from pdtop.bench.vllm_result import result_filename
    from pdtop.engine.model.loader import default_model_path

    problem = check(args)
    if problem:
        return _fail(problem)
    spec, headers, save = spec_of(args), _headers(args), args.save_result or args.append_result
    try:
        tokenizer_id = str(args.tokenizer or default_model_path())
        tokenizer = load_tokenizer(tokenizer_id)
        prompts = _prompts(args, spec, tokenizer)
        if save and args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
    except INPUT_ERRORS as exc:
        return _fail(exc)
    except ValueError as exc:  # a dataset or tokenizer folder that is not what it should be
        return _fail(exc)
    where = base_url(args)

    def unusable(exc: Exception) -> str:
        return f"cannot use {where}: {exc if isinstance(exc, ServerError) else f'{type(exc).__name__}: {exc}'}"

    try:
        if spec.model is None:
            spec.model, spec.model_id = asyncio.run(_served(spec, headers))
    except (ServerError, httpx.HTTPError) as exc:
        return _fail(unusable(exc))
    except KeyboardInterrupt:
        print("pdtop bench: interrupted while asking the server for its model", file=sys.stderr)
        return 130
    path = result_filename(spec, args.label, datetime.now().strftime("%Y%m%d-%H%M%S"), args.result_filename,
                           args.result_dir)
    problem = unwritable(path) if save else None
    if problem:
        return _fail(problem)
    columns = (TextColumn("pdtop bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    record = LoadRun()
    results: list[RequestResult] = []
    duration, interrupted = 0.0, False
    console = Console(stderr=True)
    with Progress(*columns, transient=True, console=console,
                  disable=args.disable_tqdm or not console.is_terminal) as progress:
        bar = progress.add_task("requests", total=len(prompts))
        try:
            results, duration = asyncio.run(run_load(spec, prompts, headers, lambda _: progress.advance(bar), record))
        except WarmupFailed as exc:
            problem = f"the warm-up request to {where} failed: {exc}"
        except (ServerError, httpx.HTTPError) as exc:
            problem = unusable(exc)
        except KeyboardInterrupt:
            results, duration, interrupted = record.finished(), record.duration(), True
    if problem:  # after the bar is gone, so the line is the only one
        return _fail(problem)
    if interrupted and not results:
        when = "during the warm-up request" if record.start is None else "before any request finished"
        print(f"pdtop bench: interrupted {when}", file=sys.stderr)
        return 130
    code = _report(args, spec, results, duration, tokenizer_id, record)
    if interrupted:
        print(f"pdtop bench: interrupted: {len(results)} of {len(prompts)} requests finished; "
              "the figures above are theirs", file=sys.stderr)
        return 130
    return code


def _report(args: argparse.Namespace, spec: LoadSpec, results: list[RequestResult], duration: float,
            tokenizer_id: str, record: LoadRun) -> int:
    """Print the figures (vLLM's table, or pdtop's --json object), write vLLM's result JSON if asked."""
    from pdtop.bench.loadgen import summarize
    from pdtop.bench.vllm_result import reported_metrics, result_filename, result_json, result_table

    metrics = reported_metrics(spec, tuple(args.percentile_metrics.split(",")))
    percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result = result_json(spec, results, duration, date=date, tokenizer_id=tokenizer_id, label=args.label,
                         metrics=metrics, percentiles=percentiles, detailed=args.save_detailed,
                         metadata=tuple(_pairs(args.metadata, "--metadata")[0]), rps_changes=record.rps_changes)
    summary = summarize(spec, results, duration)
    print(json_text(summary) if args.json else result_table(result, metrics, percentiles), flush=True)
    if args.save_result or args.append_result:
        path = result_filename(spec, args.label, date, args.result_filename, args.result_dir)
        try:
            _save(path, result, args.append_result)
        except OSError as exc:
            return _fail(f"cannot write the result to {path}: {exc.strerror or exc}")
    if not summary["completed"]:
        print(f"pdtop bench: error: no request completed: {'; '.join(summary['errors'])}", file=sys.stderr)
        return 1
    return 0
