"""`FleetSource`: several servers' `/metrics` pages watched together (`pdtop attach URL URL ...`), e.g. the
prefill and decode servers of a disaggregated SGLang or vLLM deployment behind a router.

Each server is read by its own `PrometheusSource` (bounded as one attach is: 5 s a read, 4 MiB a page,
backing off to 30 s while it does not answer). Once per `interval` one `fleet` event gives every
server's row: its role, whether it answers, and its latest good read. A server that stops answering
keeps its row and its last read, marked stale with the reason; one that answers again resumes. With a
`router` (an SGLang Model Gateway), its worker listing gives the servers and their roles, and is read
again every `ROUTER_EVERY_S`: new workers join; a worker the listing drops is kept, stale, saying so.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from pdtop.telemetry.encode import wire
from pdtop.telemetry.events import Fleet, FleetServer, FleetTarget, Hello, Metrics
from pdtop.telemetry.sources.prometheus import (
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW_S,
    PrometheusSource,
    metrics_url,
    shown_url,
)
from pdtop.telemetry.sources.read_only import ReadOnlySource
from pdtop.telemetry.sources.router import NotARouter, list_workers

MAX_SERVERS = 256
ROUTER_EVERY_S = 10.0
ROLE_WORDS = ("unified", "prefill", "decode")


@dataclass
class Member:
    url: str
    role: str | None  # given: --prefill / --decode, or the router's worker type
    role_from: str  # "option" | "router" | "default"
    source: PrometheusSource
    engine: str | None = None
    model_name: str | None = None
    last: Metrics | None = None  # the latest read
    dropped_reason: str | None = None  # the router no longer lists it
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def row(self) -> FleetServer:
        src = self.source
        parts = urlsplit(src.url)
        label = self.last.role if self.last is not None else None
        if self.role is not None:
            role, role_from = self.role, self.role_from
        elif label in ROLE_WORDS:
            role, role_from = label, "engine_type"
        else:
            role, role_from = "unified", "default"
        if self.dropped_reason:
            state, reason = "stale", self.dropped_reason
        elif src.state == "live":
            state, reason = "live", None
        elif src.scrapes:
            state, reason = "stale", src.last_error or "not answering"
        else:
            state, reason = "connecting", src.last_error
        return FleetServer(src.url, parts.netloc.rpartition("@")[2], role, role_from, state, reason, self.engine,
                           self.model_name, src.scrapes, self.last.time if self.last is not None else None, self.last)


class FleetSource(ReadOnlySource):
    readonly_reason = "pdtop only reads these servers' /metrics: nothing can be changed through them"

    def __init__(self, servers: list[tuple[str, str | None]], *, router: str | None = None,
                 token: str | None = None, interval: float = DEFAULT_INTERVAL_S, window_s: float = DEFAULT_WINDOW_S,
                 timeout: float = 5.0, router_every_s: float = ROUTER_EVERY_S) -> None:
        """`servers`: (URL, role or None) each; `router`: a gateway whose listing adds more (read every
        `router_every_s`). ValueError for a bad URL or role, or too many servers."""
        super().__init__()
        if not servers and router is None:
            raise ValueError("a fleet needs at least one server or a router")
        self.interval, self.window_s, self.token, self.timeout = interval, window_s, token, timeout
        self.router_every_s = router_every_s
        self.router = shown_url(router) if router else None
        self._router_url = router
        self.members: list[Member] = []
        for url, role in servers:
            self._add(url, role, "option" if role else "default")
        self.url = self.router or f"{len(self.members)} servers"

    def _add(self, url: str, role: str | None, role_from: str) -> Member | None:
        if role is not None and role not in ROLE_WORDS:
            raise ValueError(f"unknown role {role!r} (unified, prefill, decode)")
        source = PrometheusSource(url, token=self.token, interval=self.interval, window_s=self.window_s,
                                  timeout=self.timeout)
        if any(m.source.url == source.url for m in self.members):
            return None
        if len(self.members) >= MAX_SERVERS:
            raise ValueError(f"at most {MAX_SERVERS} servers in one fleet")
        member = Member(url, role, role_from, source)
        self.members.append(member)
        return member

    async def _close_parts(self) -> None:
        for m in self.members:
            await m.source.close()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        yield wire(Hello(client_id="fleet", readonly=True, engine=None,
                         fleet=FleetTarget(self.interval, self.window_s, self.router)))
        router_next = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False,
                                         headers={"Authorization": f"Bearer {self.token}"} if self.token else {}) as c:
                while not self._closed:
                    if self._router_url is not None and time.monotonic() >= router_next:
                        await self._read_router(c)
                        router_next = time.monotonic() + self.router_every_s
                    for m in self.members:
                        if m.task is None:
                            m.task = asyncio.create_task(self._follow(m), name=f"pdtop-fleet-{m.source.url}")
                    self.state = "live" if any(m.source.state == "live" for m in self.members) else self.state
                    yield wire(Fleet(time.time(), [m.row() for m in self.members]))
                    self._wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.interval)
        finally:
            for m in self.members:
                if m.task is not None:
                    m.task.cancel()
            await asyncio.gather(*(m.task for m in self.members if m.task is not None), return_exceptions=True)
            self.state = "closed"

    async def _follow(self, m: Member) -> None:
        """Keep `m`'s latest read from its own source's events."""
        async with contextlib.aclosing(m.source.reads()) as reads:
            async for event in reads:
                if isinstance(event, Hello) and event.scrape is not None:
                    m.engine, m.model_name = event.scrape.engine, event.scrape.model_name
                elif isinstance(event, Metrics):
                    m.last = event

    async def _read_router(self, client: httpx.AsyncClient) -> None:
        assert self._router_url is not None
        try:
            workers = await list_workers(client, self._router_url)
        except (NotARouter, httpx.HTTPError) as exc:
            self.last_error = f"router {self.router}: {exc if isinstance(exc, NotARouter) else 'not answering'}"
            return
        self.last_error = None
        listed = set()
        for url, role in workers:
            try:
                member = self._add(url, role, "router")
            except ValueError:  # a bad URL in the listing, or too many
                continue
            listed.add(shown_url(metrics_url(url)) if member is None else member.source.url)
        for m in self.members:
            if m.role_from == "router":
                m.dropped_reason = None if m.source.url in listed else "no longer in the router's worker list"
