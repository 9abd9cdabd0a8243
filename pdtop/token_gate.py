"""Who may control or call: the server's token, and how fast an address may guess it (`TokenGate`).

The websocket server and the HTTP API of one `pdtop serve` share one `GuessBudget`, so a
guesser gains nothing by switching ports or reconnecting. An address may give a few wrong
tokens (`FREE_GUESSES`); after that each wrong one makes it wait, twice as long each time
(1 s, 2 s, ... at most a minute), and while it waits a token it gives is not checked at all:
the answer says when to retry and reveals nothing. A right token clears the address's
record. Addresses are counted as networks: every loopback address is one (a local guesser
could otherwise use 127.0.0.2, 127.0.0.3, ...), an IPv6 address counts by its /64. Without a
token every connection may control (loopback only: the servers refuse to bind elsewhere
without one). Tokens are compared in constant time.
"""
from __future__ import annotations

import hmac
import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FREE_GUESSES = 5  # wrong tokens an address may give before it must wait
FIRST_WAIT_S, MAX_WAIT_S = 1.0, 60.0
FORGET_S = 600.0  # an address that gave no wrong token for this long starts afresh
MAX_ADDRESSES = 4096  # addresses remembered (the least recently wrong are forgotten first)


def same_token(a: str, b: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a.encode(), b.encode())


def address_key(host: str) -> str:
    """The network an address counts as: "loopback" for any loopback address, an IPv6 address's /64,
    else the address itself."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Record:
    wrong: int = 0  # wrong tokens since the record started
    until: float = 0.0  # no token is checked before this time
    last: float = 0.0  # the last wrong token


class GuessBudget:
    """Wrong tokens per address, and the wait they impose (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()  # least recently wrong first

    def wait(self, key: str) -> float:
        """Seconds before `key` may give a token again (0: now)."""
        rec = self._records.get(key)
        if rec is None:
            return 0.0
        now = self._clock()
        if now - rec.last > FORGET_S:
            del self._records[key]
            return 0.0
        return max(0.0, rec.until - now)

    def wrong(self, key: str) -> None:
        """`key` gave a wrong token."""
        now = self._clock()
        rec = self._records.pop(key, None)
        if rec is None or now - rec.last > FORGET_S:
            rec = _Record()
        rec.wrong += 1
        rec.last = now
        if rec.wrong >= FREE_GUESSES:
            rec.until = now + min(MAX_WAIT_S, FIRST_WAIT_S * 2.0 ** min(rec.wrong - FREE_GUESSES, 16))
        self._records[key] = rec
        while len(self._records) > MAX_ADDRESSES:
            self._records.popitem(last=False)

    def right(self, key: str) -> None:
        """`key` gave the right token: its wrong ones are forgotten."""
        self._records.pop(key, None)


@dataclass(frozen=True)
class Refusal:
    """Why a token was not accepted. `retry_after` > 0: the address must wait; the token was not checked."""

    reason: str
    retry_after: float = 0.0

    @property
    def retry_after_s(self) -> int:
        """`retry_after` in whole seconds, rounded up (an HTTP `Retry-After` value)."""
        return max(1, math.ceil(self.retry_after))


NO_TOKEN = Refusal("no token given")


class TokenGate:
    """The server's token (None: everyone may control) and the budget of wrong guesses it counts in."""

    def __init__(self, token: str | None, guesses: GuessBudget | None = None) -> None:
        if token is not None and not token:
            raise ValueError("the token must not be empty")
        self.token = token
        self.guesses = guesses if guesses is not None else GuessBudget()

    def check(self, given: str | None, host: str) -> Refusal | None:
        """None if a client at `host` that gave `given` (None: gave none) may control; else why not.
        A wrong token counts against `host`'s network; giving none does not."""
        if self.token is None:
            return None
        if given is None:
            return NO_TOKEN
        key = address_key(host)
        wait = self.guesses.wait(key)
        if wait > 0:
            return Refusal(f"too many wrong tokens from this address: this one was not checked; retry in "
                           f"{math.ceil(wait)} s", wait)
        if same_token(given, self.token):
            self.guesses.right(key)
            return None
        self.guesses.wrong(key)
        return Refusal("wrong token")
