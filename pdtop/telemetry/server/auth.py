"""Who may control: the server's token, given in the URL (`?token=`) or by an `auth` command.

Without a token every connection may control (loopback only: the server refuses to bind
elsewhere without one). Tokens are compared in constant time.
"""
from __future__ import annotations

import hmac


def same_token(a: str, b: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a.encode(), b.encode())


class TokenGate:
    def __init__(self, token: str | None) -> None:
        if token is not None and not token:
            raise ValueError("the token must not be empty")
        self.token = token

    def admits(self, given: str | None) -> bool:
        """Whether a connection that gave `given` (None: gave none) may control."""
        return self.token is None or (given is not None and same_token(given, self.token))
