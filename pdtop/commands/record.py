"""Record a running `pdtop serve`'s event stream, or a vLLM / SGLang server's metrics, to an NDJSON
file (gzip if it ends in .gz).

The file starts with a header holding the server's hello, then one line per event with
its time in seconds since the recording started. It is flushed at least once a second,
so a killed recorder loses at most the last second. If the connection drops, recording
goes on after the reconnect (the new hello is written as an event). Replay it with
`pdtop replay FILE`. Stops on Ctrl-C, or after --duration seconds. If the file cannot be
written (a full disk), or it stops before the server ever answered (so there is nothing to
write), it says so in one line and exits 1; a token in the URL is never printed.

An http:// URL is a server's Prometheus /metrics (vLLM, SGLang with --enable-metrics, or
`pdtop serve --api-port`): it is polled every --interval seconds and each scrape recorded as a
`metrics` event, so `pdtop replay` plays it like any other recording. Several http:// URLs (or
--prefill URL / --decode URL, or an SGLang Model Gateway's address) record a fleet: one `fleet` event
per interval with every server's row; `pdtop replay` shows the fleet table.

Examples:
  pdtop record ws://127.0.0.1:8765 -o run.ndjson.gz
  pdtop record ws://gpu-box:8765 -o run.ndjson --duration 60
  pdtop record http://gpu-box:8000 -o vllm.ndjson.gz --model-name meta-llama/Llama-3.1-8B-Instruct
  pdtop record --prefill http://p1:30000 --decode http://d1:30001 -o pd.ndjson.gz --duration 600
  pdtop record --sglang-log sglang.log -o sglang.ndjson       # SGLang without --enable-metrics: its log
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlsplit

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

if TYPE_CHECKING:
    from pdtop.telemetry.sources.fleet import FleetSource

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_fleet_arguments(parser, "record")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="recording to write (.gz: gzip)")
    parser.add_argument("--token", help="ws://: the server's token (not needed: recording only watches); "
                                         "http://: sent as `Authorization: Bearer TOKEN`")
    parser.add_argument("--duration", type=float, metavar="S", help="stop after S seconds of recording")
    add_scrape_arguments(parser)


def redacted(text: str, url: str | None) -> str:
    """`text` with the value of `url`'s `token=` query parameter replaced by `***`."""
    for token in parse_qs(urlsplit(url or "").query).get("token", []):
        if token:
            text = text.replace(quote(token, safe=""), "***").replace(token, "***")
    return text


def run(args: argparse.Namespace) -> int:
    try:
        servers = fleet_servers(args)
    except ValueError as exc:
        return fail("record", exc)
    if args.url is not None and not args.url.startswith(("ws://", "wss://")) and not is_http(args.url):
        return fail("record", redacted(f"not a ws:// or http:// URL: {args.url!r}", args.url))
    if args.url is not None and not is_http(args.url):
        from pdtop.telemetry.sources.live import check_ws_url

        try:  # up front, as an http:// URL is: not once the recording waits for it
            check_ws_url(args.url)
        except ValueError as exc:
            return fail("record", redacted(str(exc), args.url))
    if args.duration is not None and not args.duration > 0:
        return fail("record", f"--duration must be positive, got {args.duration:g}")
    problem = check_scrape_arguments(args)
    if args.url is not None and not is_http(args.url) and args.interval is not None:
        problem = "--interval is for http:// URLs (a /metrics page)"
    if problem:
        return fail("record", problem)
    try:
        fleet = make_fleet(args, servers)
    except ValueError as exc:
        return fail("record", exc)
    return asyncio.run(_record(args, fleet))


async def _record(args: argparse.Namespace, fleet: FleetSource | None = None) -> int:
    from pdtop.telemetry.recording.recorder import Recorder, RecordingError
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.telemetry.sources.prometheus import PrometheusSource

    source: LiveSource | PrometheusSource | FleetSource
    if fleet is not None:
        source, shown = fleet, fleet.url
    elif args.url is None or is_http(args.url):
        try:
            source = PrometheusSource(args.url, token=args.token, interval=args.interval, model_name=args.model_name,
                                      split=make_split(args))
        except ValueError as exc:
            return fail("record", exc)
        shown = source.url
    else:
        source = LiveSource(args.url, token=args.token, readonly=True)
        shown = redacted(args.url, args.url)
    recorder: Recorder | None = None
    print(f"pdtop record: connecting to {shown}", file=sys.stderr, flush=True)

    async def consume() -> None:
        nonlocal recorder
        announced = False
        async for event in source.events():
            if recorder is None:
                if event.get("type") != "hello":
                    continue
                recorder = Recorder(args.output, event)
            else:
                recorder.write(json.dumps(event, separators=(",", ":")))
            if not announced and (fleet is None or fleet.answered):  # a fleet's own hello is not an answer
                announced = True
                print(f"pdtop record: recording to {args.output}", flush=True)

    failure: list[RecordingError] = []

    async def flush_timer() -> None:
        said = None
        while True:
            await asyncio.sleep(0.5)
            why = source.last_error  # why the source cannot read the server now
            if why and why != said:
                print(f"pdtop record: {shown}: {why}; retrying", file=sys.stderr, flush=True)
            said = why
            if recorder is not None:
                try:
                    recorder.maybe_flush()
                except RecordingError as exc:
                    failure.append(exc)
                    task.cancel()
                    return

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(consume())
    timer = asyncio.ensure_future(flush_timer())
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    code = 0
    try:
        if args.duration is None:
            await task
        else:
            await asyncio.wait_for(asyncio.shield(task), args.duration)
    except asyncio.TimeoutError:
        task.cancel()
    except asyncio.CancelledError:
        if failure:
            code = fail("record", failure[0], code=1)
    except RecordingError as exc:
        code = fail("record", exc, code=1)
    except Exception as exc:  # a fatal connection error (HTTP status, bad host)
        code = fail("record", redacted(f"{shown}: {exc}", args.url))
    finally:
        timer.cancel()
        why = source.last_error
        await source.close()
        if not task.done():
            task.cancel()
        if recorder is None and code == 0:  # stopped (--duration, Ctrl-C) before the server ever answered
            said = f"never answered: {why}" if why else "sent no hello"
            code = fail("record", redacted(f"nothing recorded: {shown} {said}; {args.output} was not written",
                                           args.url), code=1)
        if recorder is not None and fleet is not None and not fleet.answered and code == 0:
            recorder.close()  # only the fleet's own hello and "connecting" rows: nothing was recorded
            Path(args.output).unlink(missing_ok=True)
            code = fail("record", f"nothing recorded: none of {shown} ever answered ({fleet.why_silent()}); "
                                  f"{args.output} was not written", code=1)
            recorder = None
        if recorder is not None:
            failed = recorder.closed  # a write failed and was reported above
            try:
                recorder.close()
            except RecordingError as exc:
                code = fail("record", exc, code=1)
            if not failed and code == 0:
                print(f"pdtop record: {recorder.events_written} events in {args.output}", file=sys.stderr)
    return code
