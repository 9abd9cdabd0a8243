"""`PrometheusSource`: a `Source` polling a serving engine's Prometheus `/metrics` page over HTTP.

vLLM, SGLang (`--enable-metrics`) and `pdtop serve --api-port` serve `/metrics` on their API port.
Every `interval` seconds the page is read (at most `max_bytes` of it), the engine found by its metric
prefix, one model picked by the `model_name` label, and the scrape turned into events: a `hello` whose
`scrape` describes the target (again after a reconnect, or when the engine or its models change), then
one `metrics` event per scrape, and an `error` event when a live target stops answering or its
counters go back (a restart). It is read-only: nothing can be steered over `/metrics`.

State goes "connecting" -> "live" (after the first good scrape) -> "reconnecting" (a scrape failed)
-> "live" ..., and "closed" after `close()`. While not live, `last_error` says why in one line and
`retry_at` (time.monotonic()) when the next try is; tries back off from `interval` to 30 s. A read that
takes longer than half the interval (a huge page) spaces the next one out, so reading never takes more
than half of the time.
"""
from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from pdtop.telemetry.encode import wire
from pdtop.telemetry.events import ErrorNotice, Hello, Metrics, ScrapeTarget
from pdtop.telemetry.scrape.figures import figures
from pdtop.telemetry.scrape.http_get import ClosedMidAnswer, NotHttp, PlainHttp, TooBig
from pdtop.telemetry.scrape.names import ENGINE_NAMES
from pdtop.telemetry.scrape.page import Page, PageError, read_page
from pdtop.telemetry.scrape.window import Window
from pdtop.telemetry.sources.read_only import ReadOnlySource
from pdtop.visible import visible

if TYPE_CHECKING:
    from pdtop.telemetry.sources.sglang_split import SglangSplit

MAX_PAGE_BYTES = 4 << 20  # a busy vLLM page is well under 1 MiB
MAX_RETRY_S = 30.0
DEFAULT_INTERVAL_S = 1.0
DEFAULT_WINDOW_S = 30.0
INLINE_PARSE_CHARS = 256 << 10  # a page this small is parsed on the loop (about 1 ms); larger ones in a thread
LOG_POLL_S = 0.1  # how often a followed log is read between scrapes


class ScrapeError(Exception):
    """A scrape that gave no page pdtop reads; the message is the one line the dashboard shows."""


class NoPage(ScrapeError):
    """There is no /metrics page (404, or no URL given): an SGLang log's batch lines can stand for it."""


def metrics_url(url: str) -> str:
    """`http://HOST:PORT` -> `http://HOST:PORT/metrics`; a URL with a path is taken as it is.
    ValueError for anything that is not an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an HTTP URL (http://HOST:PORT): {shown_url(url)!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


def shown_url(url: str) -> str:
    """`url` without a user name or password in it."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class PrometheusSource(ReadOnlySource):
    readonly_reason = "pdtop only reads this server's /metrics: nothing can be changed through it"

    def __init__(self, url: str | None, *, token: str | None = None, interval: float = DEFAULT_INTERVAL_S,
                 model_name: str | None = None, window_s: float = DEFAULT_WINDOW_S,
                 max_bytes: int = MAX_PAGE_BYTES, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time, split: SglangSplit | None = None,
                 page: Callable[[], Awaitable[str]] | None = None) -> None:
        """`clock`: the Unix time of a read (its `metrics` event's `time`, and what rates divide by);
        `split`: an SGLang server's split from its log or config, added to each `metrics` event. No `url`:
        the log's batch lines are the reads (the `split` must follow a log). `page`: where the page's text
        comes from instead of `url` (a gateway's /engine_metrics for a gRPC worker; it raises ScrapeError)."""
        super().__init__()
        if not interval > 0:
            raise ValueError(f"the interval must be positive, got {interval:g}")
        if url is None and (split is None or split.follower is None):
            raise ValueError("a /metrics URL, or an SGLang log (--sglang-log) to read the figures from")
        self._page = page
        self._fetch_url = metrics_url(url) if url is not None and page is None else None
        if url is None:
            self.url = visible(f"SGLang log {split.follower.name}", 300)  # type: ignore[union-attr]
        else:
            self.url = visible(shown_url(self._fetch_url or url), 300)
        self.token, self.interval, self.want_model = token, interval, model_name
        self.window_s, self.max_bytes, self.timeout, self.clock = window_s, max_bytes, timeout, clock
        self.split = split
        self._plain = _plain_http(self._fetch_url, token, max_bytes) if self._fetch_url is not None else None
        self.engine: str | None = None  # "vllm" | "sglang" | "pdtop", once a page was read
        self.model: str | None = None
        self.models: list[str] = []
        self.scrapes = 0  # good scrapes
        self._window = Window(window_s)
        self._failures = 0
        self._reported: str | None = None  # the failure an `error` event told of

    async def _close_parts(self) -> None:
        if self.split is not None:
            self.split.close()
        if self._plain is not None:
            await self._plain.close()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async with aclosing(self.reads()) as reads:
            async for event in reads:
                yield wire(event)

    async def reads(self) -> AsyncGenerator[Hello | Metrics | ErrorNotice, None]:
        """`events()` as the typed events, before they are written as JSON objects (a fleet keeps them)."""
        headers = {"Accept-Encoding": "identity"}  # the byte cap counts what the server sends
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            async with httpx.AsyncClient(headers=headers, timeout=self.timeout, follow_redirects=False) as client:
                while not self._closed:
                    started = time.monotonic()
                    try:
                        if self._page is not None:
                            text, content_type = await self._page(), ""
                        elif self._fetch_url is None:
                            raise NoPage("")
                        else:
                            text, content_type = await self._fetch(client, self._fetch_url)
                        page = _read(text, content_type) if len(text) <= INLINE_PARSE_CHARS else \
                            await asyncio.to_thread(_read, text, content_type)
                        out = self._scraped(page, self.clock())
                    except NoPage as exc:
                        out = self._from_log(str(exc), self.clock())
                    except ScrapeError as exc:
                        out = self._failed(str(exc))
                    for event in out:
                        yield event
                    took = time.monotonic() - started  # a page slow to read or parse: at most half the time
                    await self._sleep_until(self.retry_at if self.retry_at is not None else
                                            max(started + self.interval, started + 2 * took))
        finally:
            self.state = "closed"

    async def _fetch(self, client: httpx.AsyncClient, url: str) -> tuple[str, str]:
        """The page's text and content type, or ScrapeError saying why there is none. The whole read is
        bounded by `timeout` (httpx's bounds each read, so a server trickling bytes would hold it). An
        answer that breaks HTTP in a way the readers did not foresee is a failed read too, retried as a
        refused connection is: nothing a server sends ends the source."""
        try:
            return await asyncio.wait_for(self._read_body(client, url), self.timeout)
        except asyncio.TimeoutError:
            raise ScrapeError(f"no whole answer within {self.timeout:g} s (the server is too slow)") from None
        except (ScrapeError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a malformed answer: one line, and the next read tries again
            raise ScrapeError(f"not a valid HTTP answer ({visible(str(exc) or type(exc).__name__, 120)})") from None

    async def _read_body(self, client: httpx.AsyncClient, url: str) -> tuple[str, str]:
        too_big = f"the page is over {self.max_bytes / (1 << 20):g} MiB: pdtop reads at most that much of /metrics"
        if self._plain is not None:
            try:
                answer = await self._plain.get()
            except TooBig:
                raise ScrapeError(too_big) from None
            except ClosedMidAnswer:
                raise ScrapeError("the server closed the connection in the middle of its answer") from None
            except NotHttp as exc:
                raise ScrapeError(f"not an HTTP server ({exc})") from None
            except OSError as exc:
                raise ScrapeError(why_unreachable(exc)) from None
            if answer.status != 200:
                raise (NoPage if answer.status == 404 else ScrapeError)(
                    self._status(answer.status, answer.reason, answer.headers))
            return answer.body.decode("utf-8", errors="replace"), answer.headers.get("content-type", "")
        try:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise (NoPage if response.status_code == 404 else ScrapeError)(
                        self._status(response.status_code, response.reason_phrase, response.headers))
                length = response.headers.get("content-length", "")
                if length.isdigit() and int(length) > self.max_bytes:
                    raise ScrapeError(too_big)
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ScrapeError(too_big)
                    chunks.append(chunk)
                return b"".join(chunks).decode("utf-8", errors="replace"), response.headers.get("content-type", "")
        except httpx.TimeoutException:
            raise ScrapeError(f"no whole answer within {self.timeout:g} s (the server is too slow)") from None
        except httpx.RemoteProtocolError:
            raise ScrapeError("the server closed the connection in the middle of its answer") from None
        except httpx.HTTPError as exc:
            raise ScrapeError(why_unreachable(exc)) from None

    def _status(self, status: int, reason: str, headers: Mapping[str, str]) -> str:
        code = f"HTTP {status} {visible(reason, 100)}".strip()
        if status in (401, 403):
            return f"{code}: " + ("the token was refused" if self.token else "the server wants a token (--token)")
        if status == 426:  # a websocket server: `pdtop serve`'s port, not its --api-port
            return f"{code}: a websocket server (pdtop serve?): attach ws://{urlsplit(self.url).netloc} to watch it"
        if status == 404:
            return f"{code}: no /metrics at this address (SGLang serves it with --enable-metrics)"
        if status in (301, 302, 303, 307, 308) and "location" in headers:
            return f"{code}: redirected to {visible(shown_url(headers.get('location', '?')), 200)} (a login page?)"
        return code

    def _scraped(self, page: Page, now: float) -> list[Hello | Metrics | ErrorNotice]:
        model = self._pick_model(page)
        out = self._live(page.engine, model, page.models)
        read, resets = figures(page, model, self._window, now)
        if resets:
            out.append(ErrorNotice("metrics", f"{resets} counters went back: the server restarted? Rates and "
                                              "percentiles count on across it, as Prometheus's do"))
        if self.split is not None:
            self.split.fill(read)
        return self._read(out, read)

    def _from_log(self, why: str, now: float) -> list[Hello | Metrics | ErrorNotice]:
        """No page: a read from the SGLang log's batch lines, or the failure while it has none."""
        read = self.split.log_read(now) if self.split is not None and self.split.follower is not None else None
        if read is None:
            if self.split is not None and self.split.follower is not None:
                wait = f"waiting for a Decode/Prefill batch line in {self.split.follower.name}"
                why = f"{why}; {wait}" if why else wait
            return self._failed(why)
        return self._read(self._live("sglang", None, []), read)

    def _live(self, engine: str, model: str | None, models: list[str]) -> list[Hello | Metrics | ErrorNotice]:
        """The events before a good read: a hello when the source goes live or the target changes."""
        out: list[Hello | Metrics | ErrorNotice] = []
        if self.state != "live" or (engine, model, models) != (self.engine, self.model, self.models):
            if (engine, model) != (self.engine, self.model):
                if self.engine is not None:
                    out.append(ErrorNotice("metrics", f"now showing {ENGINE_NAMES[engine]} model "
                                                      f"{visible(str(model), 200)}"))
                self._window = Window(self.window_s)
            self.engine, self.model, self.models = engine, model, models
            self.state = "live"
            target = ScrapeTarget(self.url, engine, model, list(models), self.interval, self.window_s)
            out.insert(0, Hello(client_id="scrape", readonly=True, engine=None, scrape=target))
        self._failures, self._reported, self.last_error, self.retry_at = 0, None, None, None
        return out

    def _read(self, out: list[Hello | Metrics | ErrorNotice], read: Metrics) -> list[Hello | Metrics | ErrorNotice]:
        if self.split is not None:
            read.split = self.split.fields(read)
        out.append(read)
        self.scrapes += 1
        return out

    def _pick_model(self, page: Page) -> str | None:
        if self.want_model is not None:
            if self.want_model not in page.models:
                has = visible(", ".join(page.models), 300) if page.models else "no model_name label"
                raise ScrapeError(f"no model {visible(self.want_model, 200)!r} on the page (it has {has})")
            return self.want_model
        if self.model in page.models:
            return self.model
        return page.models[0] if page.models else None

    def _failed(self, reason: str) -> list[Hello | Metrics | ErrorNotice]:
        self._failures += 1
        self.last_error = reason
        self.retry_at = time.monotonic() + min(MAX_RETRY_S, self.interval * 2 ** min(self._failures - 1, 8))
        if self.state == "connecting":
            return []
        self.state = "reconnecting"
        if reason == self._reported:
            return []
        self._reported = reason
        return [ErrorNotice("metrics", f"{self.url}: {reason}")]

    async def _sleep_until(self, deadline: float) -> None:
        """Wait for `deadline` (time.monotonic()) or `close()`, reading a followed log meanwhile."""
        self._wake.clear()
        while not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), min(left, LOG_POLL_S) if self.split else left)
            except asyncio.TimeoutError:
                if self.split is not None:
                    self.split.poll()


def _plain_http(url: str, token: str | None, max_bytes: int) -> PlainHttp | None:
    """The plain-HTTP reader for an http:// URL pdtop can ask itself (no credentials in it, no IPv6
    literal); None for the rest, which httpx reads."""
    parts = urlsplit(url)
    if parts.scheme != "http" or "@" in parts.netloc or parts.hostname is None or ":" in parts.hostname:
        return None
    headers = {"Accept-Encoding": "identity", "User-Agent": "pdtop", "Accept": "*/*"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return PlainHttp(parts.hostname, parts.port or 80, target, headers, max_bytes)


def _read(text: str, content_type: str) -> Page:
    try:
        return read_page(text, content_type)
    except PageError as exc:
        raise ScrapeError(str(exc)) from None


def why_unreachable(exc: BaseException) -> str:
    """A failed request in words: `connection refused`, `unknown host`, ..."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return "connection refused (nothing listens there)"
        if isinstance(cause, OSError) and cause.errno in (-2, -3, -5):  # EAI_NONAME, EAI_AGAIN, EAI_NODATA
            return f"unknown host ({cause.strerror})"
        cause = cause.__cause__ or cause.__context__
    text = (str(exc).splitlines() or [""])[0][:200]
    if "Connection refused" in text:
        return "connection refused (nothing listens there)"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return text or type(exc).__name__
