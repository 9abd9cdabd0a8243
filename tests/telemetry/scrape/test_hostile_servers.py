"""Hostile `/metrics` servers on loopback (issue 38): malformed HTTP framing is a failed read that is retried
(item 13), labels that change on every read do not grow the parse cache past its byte bound (item 6), and
terminal escapes in a label, a status line or a redirect are shown as escapes, never sent to the
terminal (item 3)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from contextlib import aclosing

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import ErrorNotice, Metrics
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.scrape import page
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.ui.app import PdtopApp

from ..conftest import header_text, next_of
from ..conftest import until_shown as until
from ..servers import PageServer, RawServer, VllmMetrics, http_answer

PAGE = b'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
# (answer, what the one-line reason says): each broke main's reader with an uncaught exception, which ended
# `attach` for good and made `record` exit 2
MALFORMED = ((b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nab", "Content-Length"),  # latin-1 superscript two
             (b"HTTP/1.1 \xb200 OK\r\nContent-Length: 2\r\n\r\nab", "not an HTTP answer"),
             (CHUNKED + b"-5\r\nabc\r\n0\r\n\r\n", "chunk size"),
             (CHUNKED + b"1" * (64 << 10) + b"\r\n", "chunk size"))


async def test_malformed_framing_is_a_failed_read_that_is_retried():
    server = RawServer([http_answer(PAGE)] + [answer for answer, _ in MALFORMED], http_answer(PAGE))
    src = PrometheusSource(server.url, interval=0.05, window_s=60.0)
    try:
        async with aclosing(src.events()) as events:
            assert decode_event(await next_of(events, "metrics")).running == 3
            said = []
            while len(said) < len(MALFORMED):
                event = decode_event(await next_of(events, "error", timeout=20))
                assert isinstance(event, ErrorNotice)
                said.append(event.reason)
            for (_, what), reason in zip(MALFORMED, said, strict=True):
                assert what in reason and reason.startswith(src.url), said
            again = decode_event(await next_of(events, "metrics", timeout=20))
            assert isinstance(again, Metrics) and again.running == 3 and src.state == "live"
    finally:
        await src.close()
        server.close()


def test_record_goes_on_across_malformed_framing(tmp_path):
    server = RawServer([http_answer(PAGE)] + [answer for answer, _ in MALFORMED], http_answer(PAGE))
    path = tmp_path / "r.ndjson"
    try:
        done = subprocess.run([sys.executable, "-m", "pdtop", "record", server.url, "-o", str(path), "--interval",
                               "0.05", "--duration", "4"], capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr  # main: exit 2 at the first
    events = [event for _, event in read_recording(path)]
    said = [event["reason"] for event in events if event["type"] == "error"]
    assert len(said) == len(MALFORMED) and all("not an HTTP server" in reason for reason in said)
    assert events[-1]["type"] == "metrics" and sum(event["type"] == "metrics" for event in events) >= 2


def _cache_size() -> int:
    """What the parse cache holds, by the objects' own sizes (not its own count)."""
    total = 0
    cache = getattr(page._SERIES, "series", page._SERIES)  # (main: a plain dict)
    for key, (name, labels) in cache.items():
        total += sys.getsizeof(key) + sys.getsizeof(name) + sys.getsizeof(labels) + 64
        total += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in labels.items())
    return total


async def test_labels_that_change_on_every_read_do_not_grow_the_cache():
    """10 reads of 1 MiB, each line's `engine` label new (3.9 KiB): 10 MiB of series, which a cache capped in
    entries kept (main held all 2,600 of them, about 22 MB by their objects' sizes, and would have gone on
    to 65,536). The bound: the cache's objects stay under `MAX_SERIES_CACHE_BYTES` (16 MiB), which holds a
    fleet of 256 servers' pages."""
    filler = "x" * 3900
    pages = ["".join(f'vllm:num_requests_running{{model_name="m",engine="{i}-{j}-{filler}"}} 1\n'
                     for j in range(260)).encode() for i in range(10)]
    server = PageServer()
    server.pages = pages
    src = PrometheusSource(server.url, interval=0.05, window_s=60.0)
    try:
        async with aclosing(src.events()) as events:
            while src.scrapes < len(pages):
                await next_of(events, "metrics", timeout=30)
        assert len(server.requests) >= len(pages)
        assert _cache_size() <= 16 << 20  # page.MAX_SERIES_CACHE_BYTES
    finally:
        await src.close()
        server.close()


EVIL = "evil\x1b]0;pwned\x07\x1b]52;c;SGVsbG8=\x07\x1b[2J\u202e"  # window title, clipboard, clear screen, bidi


async def test_escapes_in_a_label_are_shown_as_escapes_in_the_header():
    metrics = VllmMetrics(models=(EVIL,))
    metrics.m(metrics.running, EVIL).set(4)
    metrics.server = PageServer(metrics.registry)
    src = PrometheusSource(metrics.server.url, interval=0.1)
    app = PdtopApp(src, interval_s=0.05)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
            header = header_text(app)
            assert "\\x1b]0;pwned\\x07" in header and "\x1b" not in header and "\x07" not in header
            assert "\u202e" not in header
    finally:
        await src.close()
        metrics.server.close()


async def first_failure(src: PrometheusSource, timeout: float = 10.0) -> str:
    """The source's first failed read, in its one line (the read loop runs meanwhile)."""
    async def loop() -> None:
        async for _ in src.reads():
            pass

    task = asyncio.create_task(loop())
    try:
        deadline = time.monotonic() + timeout
        while src.last_error is None:
            assert time.monotonic() < deadline, "no failed read"
            await asyncio.sleep(0.02)
        return src.last_error
    finally:
        await src.close()
        await task


async def test_escapes_in_a_status_line_and_a_redirect_are_shown_as_escapes():
    redirect = http_answer(b"", b"HTTP/1.1 302 Fo\x1b[2Jund", b"Location: http://login.example/\x1b]0;pwned\x07\r\n")
    server = RawServer([], redirect)
    try:
        reason = await first_failure(PrometheusSource(server.url, interval=0.05))
    finally:
        server.close()
    assert "\x1b" not in reason and "\x07" not in reason
    assert "HTTP 302 Fo\\x1b[2Jund: redirected to http://login.example/\\x1b]0;pwned\\x07" in reason


def test_record_prints_a_hostile_redirect_as_escapes(tmp_path):
    redirect = http_answer(b"", b"HTTP/1.1 302 Found", b"Location: http://x/\x1b]52;c;SGVsbG8=\x07\r\n")
    server = RawServer([], redirect)
    try:
        done = subprocess.run([sys.executable, "-m", "pdtop", "record", server.url, "-o", str(tmp_path / "r.ndjson"),
                               "--duration", "1.2"], capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert done.returncode == 1  # it never answered: nothing recorded (issue 42 item 19)
    assert "redirected to http://x/\\x1b]52;c;SGVsbG8=\\x07" in done.stderr and "\x1b" not in done.stderr


async def test_escapes_in_a_recordings_model_name_are_shown_as_escapes_in_replay(tmp_path):
    """A recording is outside input too: a scraped page's model and an engine's model, replayed."""
    from pdtop.engine.build import build_engine
    from pdtop.telemetry.encode import wire
    from pdtop.telemetry.events import Hello, ScrapeTarget
    from pdtop.telemetry.recording.recorder import Recorder
    from pdtop.telemetry.sources.replay import ReplaySource

    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b")
    try:
        description = engine.describe()
    finally:
        engine.close()
    description.model = EVIL
    scrape = ScrapeTarget("http://gpu-box:8000/metrics", "vllm", EVIL, [EVIL], 1.0, 30.0)
    for hello in (Hello(client_id="scrape", readonly=True, engine=None, scrape=scrape),
                  Hello(client_id="recorder", readonly=True, engine=description)):
        path = tmp_path / f"{hello.client_id}.ndjson"
        recorder = Recorder(path, wire(hello))
        recorder.write('{"type":"error","v":1,"field":"metrics","reason":"x"}', t=0.1)
        recorder.close()
        app = PdtopApp(ReplaySource(path, speed=16.0), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda app=app: app.state.hello, "the hello")
            header = header_text(app)
            assert "\\x1b]0;pwned\\x07" in header and "\x1b" not in header and "\x07" not in header
            await app.source.close()
