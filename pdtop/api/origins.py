"""Who may reach the API from a browser: the websocket's `--allow-origin` rule, and a Host check on loopback.

A page on another site can POST to http://127.0.0.1:PORT (a form, or `fetch` without reading
the answer), and a DNS-rebinding page can even read the answers, since its requests carry
its own name in `Host`. So, as the telemetry port does:
- a request with an `Origin` header is refused (403) unless that origin was allowed
  (`--allow-origin`); programs (curl, the OpenAI client, pdtop's load generator) send none;
- on a loopback bind, a request whose `Host` is not a loopback name or address (`localhost`,
  `127.0.0.1`, `[::1]`, any port) is refused (403): no DNS name points there for a reason.
"""
from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Any

from pdtop.quiet_log import QuietLog


def loopback_host(host: str) -> bool:
    """Whether a Host header's value (name or address, with or without a port) names this machine's loopback."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:8000
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name in ("localhost", "localhost.") or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class OriginGuard:
    """ASGI middleware: 403 in OpenAI's error shape for a disallowed Origin or, if `check_host`, Host."""

    def __init__(self, app: Any, allow_origins: Sequence[str], check_host: bool, quiet: QuietLog) -> None:
        self.app, self.check_host, self.quiet = app, check_host, quiet
        self.allow_origins = {o.rstrip("/").lower() for o in allow_origins}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            why = self._refusal(scope["headers"])
            if why is not None:
                self.quiet.warning("forbidden: " + why[0], "refused a request: %s", why[1])
                await _forbidden(send, why[1], why[0])
                return
        await self.app(scope, receive, send)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
        for name, value in headers:
            if name == b"origin":
                origin = value.decode("latin-1").rstrip("/").lower()
                if origin not in self.allow_origins:
                    return "origin_not_allowed", (f"Origin {origin[:100]!r} is not allowed (serve --allow-origin "
                                                  "adds one)")
            elif name == b"host" and self.check_host and not loopback_host(value.decode("latin-1")):
                return "host_not_allowed", (f"Host {value.decode('latin-1')[:100]!r} is not this loopback server's "
                                            "(use localhost or 127.0.0.1)")
        return None


async def _forbidden(send: Any, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
