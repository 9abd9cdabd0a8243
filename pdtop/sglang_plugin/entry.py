"""The entry point SGLang's `load_plugins()` calls in each of its processes (group `sglang.srt.plugins`).

Off (no `PDTOP_SGLANG_PORT`) it does nothing at all: no import of SGLang, no hook. On, it registers
the hooks; anything that goes wrong is one warning line, and SGLang runs as without pdtop.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from pdtop.sglang_plugin.settings import Settings, SettingsError

if TYPE_CHECKING:
    from pdtop.sglang_plugin.hooks import Plugin

log = logging.getLogger("pdtop.sglang_plugin")

# The process's plugin once registered (tests read it; SGLang loads plugins once per process).
installed: Plugin | None = None


def register() -> None:
    global installed
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        log.warning("pdtop: %s; SGLang runs without pdtop", exc)
        return
    if settings is None:
        return
    try:
        from pdtop.sglang_plugin.hooks import install

        installed = install(settings)
    except Exception as exc:
        log.warning("pdtop: could not register its hooks (%s: %s); SGLang runs without pdtop",
                    type(exc).__name__, exc)
