"""`FleetSource`: several servers' `/metrics` pages watched together (`pdtop attach URL URL ...`), e.g. the
prefill and decode servers of a disaggregated SGLang or vLLM deployment behind a router.

Each server is read by its own `PrometheusSource` (bounded as one attach is: 5 s a read, 4 MiB a page,
backing off to 30 s while it does not answer). Once per `interval` one `fleet` event gives every
server's row: its role, whether it answers, and its latest good read. A server that stops answering
keeps its row and its last read, marked stale with the reason; one that answers again resumes. With a
`router` (an SGLang Model Gateway), its worker listing gives the servers and their roles, and is read
again every `ROUTER_EVERY_S`: new workers join; a worker the listing drops is kept, stale, saying so. A
DP-aware worker's ranks are one server (one row, its `/metrics` read once); a gRPC worker's figures come
from the gateway's `/engine_metrics`, read once per interval for all of them. The token goes to the
servers and the router the user named, never to the workers a router lists (any address can be listed).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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
    ScrapeError,
    metrics_url,
    shown_url,
)
from pdtop.telemetry.sources.read_only import ReadOnlySource
from pdtop.telemetry.sources.router import EngineMetrics, GatewayError, NotARouter, Worker, list_workers
from pdtop.visible import visible

MAX_SERVERS = 256
ROUTER_EVERY_S = 10.0
ROLE_WORDS = ("unified", "prefill", "decode")


@dataclass
class Member:
    url: str
    role: str | None  # given: --prefill / --decode, or the router's worker type
    role_from: str  # "option" | "router" | "default"
    source: PrometheusSource
    dp_ranks: list[int] | None = None  # a gateway's DP-aware worker: the ranks it was listed with
    via: str | None = None  # the page its figures come from when not its own /metrics
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
                           self.model_name, src.scrapes, self.last.time if self.last is not None else None, self.last,
                           self.dp_ranks, self.via)


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
        self.router = visible(shown_url(router), 300) if router else None
        self._router_url = router
        self._gateway = EngineMetrics(router, token, interval, timeout) if router else None
        self.members: list[Member] = []
        for url, role in servers:
            self._add(Worker(url, role), "option" if role else "default", token)
        self.url = self.router or f"{len(self.members)} servers"
        self.answered = False  # whether any member has ever answered (a recording of none holds nothing)

    def _add(self, worker: Worker, role_from: str, token: str | None) -> Member | None:
        """A member for `worker` (None when the fleet has it); `token`: only for an address the user named."""
        if worker.role is not None and worker.role not in ROLE_WORDS:
            raise ValueError(f"unknown role {worker.role!r} (unified, prefill, decode)")
        if worker.grpc and self._gateway is None:
            raise ValueError(f"a gRPC worker has no /metrics: {visible(worker.url, 200)}")
        source = PrometheusSource(worker.url, token=token, interval=self.interval, window_s=self.window_s,
                                  timeout=self.timeout, page=self._gateway_page(worker) if worker.grpc else None)
        if any(m.source.url == source.url for m in self.members):
            return None
        if len(self.members) >= MAX_SERVERS:
            raise ValueError(f"at most {MAX_SERVERS} servers in one fleet")
        member = Member(worker.url, worker.role, role_from, source, list(worker.dp_ranks) or None,
                        self._gateway.url if worker.grpc and self._gateway is not None else None)
        self.members.append(member)
        return member

    def _gateway_page(self, worker: Worker) -> Callable[[], Awaitable[str]]:
        """A gRPC worker's page: its lines of the gateway's /engine_metrics (one rank's, for a DP-aware one:
        each rank's address there is the same server's page)."""
        gateway = self._gateway
        assert gateway is not None
        addresses = [worker.url, *(f"{worker.url}@{rank}" for rank in worker.dp_ranks)]

        async def page() -> str:
            problem = "?"
            for address in addresses:
                try:
                    return await gateway.page(address)
                except GatewayError as exc:
                    problem = str(exc)
            raise ScrapeError(problem)

        return page

    async def _close_parts(self) -> None:
        for m in self.members:
            await m.source.close()

    def why_silent(self) -> str:
        """Why no member answers, in the first member's words that say (or the router's)."""
        return self.last_error or next((m.source.last_error for m in self.members if m.source.last_error),
                                       "not answering")

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
                    if any(m.source.state == "live" for m in self.members):
                        self.state, self.answered = "live", True
                    yield wire(Fleet(time.time(), [m.row() for m in self.members]))
                    self._wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.interval)
        finally:
            for m in self.members:
                m.source.stop()  # (a cancellation alone can be lost)
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
            workers = await list_workers(client, self._router_url, self.timeout)
        except (NotARouter, httpx.HTTPError) as exc:
            self.last_error = f"router {self.router}: {exc if isinstance(exc, NotARouter) else 'not answering'}"
            return
        self.last_error = None
        listed = set()
        for worker in workers:
            try:
                member = self._add(worker, "router", None)
            except ValueError:  # a bad URL in the listing, or too many
                continue
            if member is None:  # already a member: the same page
                shown = worker.url if worker.grpc else shown_url(metrics_url(worker.url))
                listed.add(visible(shown, 300))
            else:
                listed.add(member.source.url)
        for m in self.members:
            if m.role_from == "router":
                m.dropped_reason = None if m.source.url in listed else "no longer in the router's worker list"
