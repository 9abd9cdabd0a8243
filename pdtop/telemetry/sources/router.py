"""An SGLang Model Gateway (sgl-router): its worker listing, and its `/engine_metrics` page.

The gateway answers `GET /workers` with `{"workers": [{"url": ..., "worker_type": "regular" | "prefill"
| "decode", "connection_mode": "http" | "grpc", ...}], "total": N, "stats": {...}}` (its
`WorkerListResponse`); older sgl-router answers `GET /list_workers` with `{"urls": [...]}`. A DP-aware
worker is listed once per rank as `http://host:port@rank`: one server, one `/metrics`, so its ranks make
one `Worker`. A gRPC worker (`grpc://host:port`) has no `/metrics` pdtop can read; the gateway's
`GET /engine_metrics` has it: each worker's page, fetched by the gateway, its names' `:` written as `_`
(`sglang_num_running_reqs`, `vllm_...`) and a `worker_addr` label naming the worker (sgl-model-gateway's
`metrics_aggregator.rs`). `EngineMetrics` reads that page once per interval for every worker that
needs it and gives each its own lines, under the engines' own names again.

A listing is outside input: it is read with a deadline on the whole answer (a server dripping a byte a
second is cut off), at most `MAX_LISTING_BYTES`, parsed only when its nesting is shallow, and at most
`MAX_WORKERS` workers are taken. The listing's workers never get the gateway's token: only the
addresses the user named do (docs/scrape.md).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from pdtop.visible import visible

MAX_LISTING_BYTES = 1 << 20
MAX_WORKERS = 256
MAX_DEPTH = 32  # nesting of a listing's JSON: the gateway's is 4 deep
MAX_ENGINE_METRICS_BYTES = 32 << 20  # every worker's page together (15-200 KiB each)
LISTINGS = ("/workers", "/list_workers")
ROLES = {"regular": "unified", "prefill": "prefill", "decode": "decode"}
SCHEMES = ("http://", "https://", "grpc://")
_PREFIXES = ("sglang_", "vllm_", "pdtop_")  # the engines' prefixes as /engine_metrics writes them
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class NotARouter(Exception):
    """The address answered, but not with a worker listing (a plain server, most likely)."""


class GatewayError(Exception):
    """The gateway's page could not be read; the message says why in one line."""


@dataclass(frozen=True)
class Worker:
    """One server behind the gateway: `url` without a DP rank, its role, and the ranks it was listed with."""

    url: str
    role: str | None
    dp_ranks: tuple[int, ...] = ()

    @property
    def grpc(self) -> bool:
        return self.url.startswith("grpc://")


def split_rank(url: str) -> tuple[str, int | None]:
    """`http://host:port@3` -> (`http://host:port`, 3); a URL without a numeric `@rank` is as it is."""
    base, at, rank = url.rpartition("@")
    if at and rank.isascii() and rank.isdigit() and len(rank) <= 6 and "/" not in rank:
        return base, int(rank)
    return url, None


def workers_of(listing: Any) -> list[Worker]:
    """The workers of a listing's JSON, DP ranks of one server together; NotARouter if it is no listing."""
    entries: list[tuple[str, str | None]] = []
    if isinstance(listing, dict) and isinstance(listing.get("workers"), list):
        for w in listing["workers"][:MAX_WORKERS * 16]:
            if isinstance(w, dict) and isinstance(w.get("url"), str) and w["url"].startswith(SCHEMES):
                kind = str(w.get("worker_type", "")).lower()
                entries.append((w["url"], next((r for k, r in ROLES.items() if kind.startswith(k)), None)))
    elif isinstance(listing, dict) and isinstance(listing.get("urls"), list):
        entries = [(u, None) for u in listing["urls"][:MAX_WORKERS * 16]
                   if isinstance(u, str) and u.startswith(SCHEMES)]
    else:
        raise NotARouter("not a worker listing")
    grouped: dict[str, tuple[str | None, list[int]]] = {}
    for url, role in entries:
        base, rank = split_rank(url)
        if base not in grouped:
            if len(grouped) >= MAX_WORKERS:
                continue
            grouped[base] = (role, [])
        if rank is not None:
            grouped[base][1].append(rank)
    return [Worker(url, role, tuple(sorted(set(ranks)))) for url, (role, ranks) in grouped.items()]


def _too_deep(body: bytes) -> bool:
    """Whether the JSON text nests deeper than MAX_DEPTH, or closes more than it opened (brackets inside
    strings count too: an over-count only refuses what no gateway writes). The brackets are picked out
    at C speed and the walk stops at the first sign."""
    depth = 0
    for byte in body.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in (0x5B, 0x7B) else -1
        if depth > MAX_DEPTH or depth < 0:
            return True
    return False


def _listing(status: int, body: bytes | None) -> list[Worker] | None:
    if status != 200 or body is None or _too_deep(body):
        return None
    try:
        return workers_of(json.loads(body))
    except (ValueError, RecursionError, NotARouter):
        return None


async def _read_capped(client: httpx.AsyncClient, url: str, max_bytes: int) -> tuple[int, bytes | None]:
    """The status and body, None for a body over `max_bytes` (reading stops there)."""
    async with client.stream("GET", url) as response:
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                return response.status_code, None
            chunks.append(chunk)
        return response.status_code, b"".join(chunks)


async def list_workers(client: httpx.AsyncClient, base: str, timeout: float = 5.0) -> list[Worker]:
    """The gateway's workers; NotARouter when `base` is no gateway (or answers no listing in `timeout`
    seconds, however it trickles), httpx.HTTPError when unreachable."""
    for path in LISTINGS:
        try:
            answer = await asyncio.wait_for(_read_capped(client, base.rstrip("/") + path, MAX_LISTING_BYTES), timeout)
        except asyncio.TimeoutError:
            raise NotARouter(f"no whole worker listing within {timeout:g} s") from None
        workers = _listing(*answer)
        if workers is not None:
            return workers
    raise NotARouter(f"{visible(base, 200)} gives no worker listing (GET /workers or /list_workers)")


def probe_router(base: str, token: str | None = None, timeout: float = 1.5) -> list[Worker] | None:
    """The workers if `base` is a gateway, else None (not one, or not answering now, or not within
    `timeout` seconds for each listing however it trickles): for `attach URL`. Synchronous: the commands
    ask before any event loop runs."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as client:
            for path in LISTINGS:
                deadline = time.monotonic() + timeout
                with client.stream("GET", base.rstrip("/") + path) as response:
                    body: list[bytes] | None = []
                    size = 0
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                        if size > MAX_LISTING_BYTES or time.monotonic() > deadline:
                            body = None
                            break
                        body.append(chunk)  # type: ignore[union-attr]
                    workers = _listing(response.status_code, b"".join(body) if body is not None else None)
                if workers is not None:
                    return workers
    except httpx.HTTPError:
        return None
    return None


class EngineMetrics:
    """The gateway's `/engine_metrics`, read at most once per `interval` and split by `worker_addr`."""

    def __init__(self, base: str, token: str | None, interval: float, timeout: float = 5.0,
                 max_bytes: int = MAX_ENGINE_METRICS_BYTES) -> None:
        self.url = base.rstrip("/") + "/engine_metrics"
        self.interval, self.timeout, self.max_bytes = interval, timeout, max_bytes
        self._headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {token}"} if token else {})}
        self._lock = asyncio.Lock()
        self._read_at = -1e9
        self._pages: dict[str, list[str]] = {}
        self._error: str | None = None

    async def page(self, worker: str) -> str:
        """The lines of `worker` (its URL as the gateway lists it), under the engines' names; GatewayError
        when the page cannot be read or has none of its lines."""
        async with self._lock:
            if time.monotonic() - self._read_at >= self.interval / 2:
                self._read_at = time.monotonic()
                try:
                    self._pages, self._error = split_by_worker(await self._fetch()), None
                except GatewayError as exc:
                    self._pages, self._error = {}, str(exc)
        if self._error is not None:
            raise GatewayError(self._error)
        lines = self._pages.get(worker)
        if not lines:
            raise GatewayError(f"the gateway's /engine_metrics has no series of {visible(worker, 200)} "
                               "(it could not read that worker)")
        return "\n".join(lines) + "\n"

    async def _fetch(self) -> str:
        try:
            async with httpx.AsyncClient(headers=self._headers, timeout=self.timeout, follow_redirects=False) as c:
                status, body = await asyncio.wait_for(_read_capped(c, self.url, self.max_bytes), self.timeout)
        except asyncio.TimeoutError:
            raise GatewayError(f"no whole /engine_metrics within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise GatewayError(f"/engine_metrics: {visible(str(exc) or type(exc).__name__, 120)}") from None
        if status == 404:
            raise GatewayError("the gateway has no /engine_metrics (an older sgl-router?)")
        if status != 200:
            raise GatewayError(f"/engine_metrics: HTTP {status}")
        if body is None:
            raise GatewayError(f"/engine_metrics is over {self.max_bytes >> 20} MiB")
        return body.decode("utf-8", errors="replace")


def split_by_worker(text: str) -> dict[str, list[str]]:
    """The engine sample lines of an `/engine_metrics` page by their `worker_addr`, each name's first `_`
    back to the `:` the engines write (`sglang_num_running_reqs` -> `sglang:num_running_reqs`)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        at = line.find('worker_addr="')
        if at < 0:
            continue
        start = at + len('worker_addr="')
        end = line.find('"', start)
        if end < 0:
            continue
        worker = line[start:end]
        if worker not in out and len(out) >= MAX_WORKERS * 16:
            continue
        prefix, _, rest = line.partition("_")
        out.setdefault(worker, []).append(f"{prefix}:{rest}")
    return out
