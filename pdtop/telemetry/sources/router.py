"""An SGLang Model Gateway's (sgl-router's) worker listing: which servers it routes to, and their roles.

The gateway answers `GET /workers` with `{"workers": [{"url": ..., "worker_type": "regular" | "prefill"
| "decode", "is_healthy": ..., ...}], "total": N, "stats": {...}}` (its `WorkerListResponse`); older
sgl-router answers `GET /list_workers` with `{"urls": [...]}`. Anything else is not a gateway.
"""
from __future__ import annotations

import json
from typing import Any

import httpx

MAX_LISTING_BYTES = 1 << 20
MAX_WORKERS = 256
LISTINGS = ("/workers", "/list_workers")
ROLES = {"regular": "unified", "prefill": "prefill", "decode": "decode"}


class NotARouter(Exception):
    """The address answered, but not with a worker listing (a plain server, most likely)."""


def workers_of(listing: Any) -> list[tuple[str, str | None]]:
    """(worker URL, role or None) from a listing's JSON; NotARouter if it is no listing."""
    if isinstance(listing, dict) and isinstance(listing.get("workers"), list):
        out: list[tuple[str, str | None]] = []
        for w in listing["workers"][:MAX_WORKERS]:
            if isinstance(w, dict) and isinstance(w.get("url"), str) and w["url"].startswith(("http://", "https://")):
                kind = str(w.get("worker_type", "")).lower()
                out.append((w["url"], next((r for k, r in ROLES.items() if kind.startswith(k)), None)))
        return out
    if isinstance(listing, dict) and isinstance(listing.get("urls"), list):
        return [(u, None) for u in listing["urls"][:MAX_WORKERS] if isinstance(u, str)
                and u.startswith(("http://", "https://"))]
    raise NotARouter("not a worker listing")


def _listing(status: int, body: bytes | None) -> list[tuple[str, str | None]] | None:
    if status != 200 or body is None:
        return None
    try:
        return workers_of(json.loads(body))
    except (ValueError, NotARouter):
        return None


async def _read_capped(client: httpx.AsyncClient, url: str) -> tuple[int, bytes | None]:
    """The status and body, None for a body over MAX_LISTING_BYTES (reading stops there)."""
    async with client.stream("GET", url) as response:
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_LISTING_BYTES:
                return response.status_code, None
            chunks.append(chunk)
        return response.status_code, b"".join(chunks)


async def list_workers(client: httpx.AsyncClient, base: str) -> list[tuple[str, str | None]]:
    """The gateway's workers; NotARouter when `base` is no gateway, httpx.HTTPError when unreachable."""
    for path in LISTINGS:
        workers = _listing(*await _read_capped(client, base.rstrip("/") + path))
        if workers is not None:
            return workers
    raise NotARouter(f"{base} gives no worker listing (GET /workers or /list_workers)")


def probe_router(base: str, token: str | None = None, timeout: float = 1.5) -> list[tuple[str, str | None]] | None:
    """The workers if `base` is a gateway, else None (not one, or not answering now): for `attach URL`.
    Synchronous: the commands ask before any event loop runs."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as client:
            for path in LISTINGS:
                with client.stream("GET", base.rstrip("/") + path) as response:
                    body, size = [], 0
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                        if size > MAX_LISTING_BYTES:
                            break
                        body.append(chunk)
                    workers = _listing(response.status_code, b"".join(body) if size <= MAX_LISTING_BYTES else None)
                if workers is not None:
                    return workers
    except httpx.HTTPError:
        return None
    return None
