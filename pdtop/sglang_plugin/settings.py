"""The plugin's settings, from the environment SGLang was started in.

`PDTOP_SGLANG_PORT` switches the plugin on (unset or empty: installed but off); `PDTOP_SGLANG_HOST`
is where pdtop's websocket server binds (default loopback); `PDTOP_TOKEN` is the control token, as
for `pdtop serve`: without it only a loopback bind is allowed, and every client may control.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PORT, HOST, TOKEN = "PDTOP_SGLANG_PORT", "PDTOP_SGLANG_HOST", "PDTOP_TOKEN"


class SettingsError(ValueError):
    """A setting the plugin cannot run with (one line, naming the variable)."""


@dataclass(frozen=True)
class Settings:
    port: int  # 0: any free port (tests)
    host: str = "127.0.0.1"
    token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings | None:
        """The settings `env` gives; None when the plugin is off. SettingsError for a bad value."""
        raw = env.get(PORT, "").strip()
        if not raw:
            return None
        from pdtop.telemetry.server.server import is_loopback  # only once on: off, SGLang's processes import nothing

        if not raw.isdigit() or int(raw) > 65535:
            raise SettingsError(f"{PORT}={raw!r} is not a port (0..65535)")
        host = env.get(HOST, "").strip() or "127.0.0.1"
        token = env.get(TOKEN) or None
        if not is_loopback(host) and token is None:
            raise SettingsError(f"{HOST}={host} is not a loopback address: set {TOKEN} too (control and "
                                "non-loopback binds need a token)")
        return cls(int(raw), host, token)
