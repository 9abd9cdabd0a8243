"""Record a running `pdtop serve`'s event stream to an NDJSON file (gzip if it ends in .gz).

The file starts with a header holding the server's hello, then one line per event with
its time in seconds since the recording started. It is flushed at least once a second,
so a killed recorder loses at most the last second. If the connection drops, recording
goes on after the reconnect (the new hello is written as an event). Replay it with
`pdtop replay FILE`. Stops on Ctrl-C, or after --duration seconds. If the file cannot be
written (a full disk), it says so in one line and exits 1; a token in the URL is never printed.

Examples:
  pdtop record ws://127.0.0.1:8765 -o run.ndjson.gz
  pdtop record ws://gpu-box:8765 -o run.ndjson --duration 60
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from urllib.parse import parse_qs, quote, urlsplit

from pdtop.commands._common import fail


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", metavar="URL", help="the server, e.g. ws://127.0.0.1:8765")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="recording to write (.gz: gzip)")
    parser.add_argument("--token", help="the server's token (not needed: anyone may watch; recording only watches)")
    parser.add_argument("--duration", type=float, metavar="S", help="stop after S seconds of recording")


def redacted(text: str, url: str) -> str:
    """`text` with the value of `url`'s `token=` query parameter replaced by `***`."""
    for token in parse_qs(urlsplit(url).query).get("token", []):
        if token:
            text = text.replace(quote(token, safe=""), "***").replace(token, "***")
    return text


def run(args: argparse.Namespace) -> int:
    if not args.url.startswith(("ws://", "wss://")):
        return fail("record", redacted(f"not a websocket URL (ws://HOST:PORT): {args.url!r}", args.url))
    if args.duration is not None and not args.duration > 0:
        return fail("record", f"--duration must be positive, got {args.duration:g}")
    return asyncio.run(_record(args))


async def _record(args: argparse.Namespace) -> int:
    from pdtop.telemetry.recording.recorder import Recorder, RecordingError
    from pdtop.telemetry.sources.live import LiveSource

    source = LiveSource(args.url, token=args.token, readonly=True)
    recorder: Recorder | None = None
    shown = redacted(args.url, args.url)
    print(f"pdtop record: connecting to {shown}", file=sys.stderr, flush=True)

    async def consume() -> None:
        nonlocal recorder
        async for event in source.events():
            if recorder is None:
                if event.get("type") != "hello":
                    continue
                recorder = Recorder(args.output, event)
                print(f"pdtop record: recording to {args.output}", flush=True)
                continue
            recorder.write(json.dumps(event, separators=(",", ":")))

    failure: list[RecordingError] = []

    async def flush_timer() -> None:
        while True:
            await asyncio.sleep(0.5)
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
        await source.close()
        if not task.done():
            task.cancel()
        if recorder is not None:
            failed = recorder.closed  # a write failed and was reported above
            try:
                recorder.close()
            except RecordingError as exc:
                code = fail("record", exc, code=1)
            if not failed and code == 0:
                print(f"pdtop record: {recorder.events_written} events in {args.output}", file=sys.stderr)
    return code
