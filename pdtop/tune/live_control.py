"""Setting knobs on a running server over pdtop's websocket protocol (docs/protocol.md): what `tune --launch`
does between candidates that differ only in what can change live, instead of starting a new server.

Both `pdtop serve` and SGLang with pdtop's plugin (`PDTOP_SGLANG_PORT`) speak it: the first frame is
`hello` (the configuration in force), a `set` message gets a `reply` (refused: `ok: false` with the
reason), and an accepted change is applied at a round boundary, which a `config` event reports. A set
counts as done once the configuration in force holds every value asked for.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from pdtop.engine.errors import EngineError
from pdtop.engine.scheduling.commands import Set
from pdtop.telemetry.server.commands import to_wire

# Knobs that change without a restart: SGLang's scheduler reads them at each switch (the plugin takes
# these; pdtop's engine takes them all live).
LIVE_KEYS = ("decode_bs_divisor", "manual_divisions", "split_forward_token_budget", "max_split_forward_layers")
MAX_FRAME = 1 << 20


class ControlRefused(EngineError):
    """The server refused a change (or never applied it): the candidate needs a server of its own."""


class LiveControl:
    """A control connection to `ws://127.0.0.1:PORT/`; `config` is the configuration in force."""

    def __init__(self, port: int, token: str | None = None, timeout_s: float = 30.0):
        from websockets.sync.client import connect

        # batch=1: the stream in one frame per server tick (replies, config and hello stay frames of their own)
        url = f"ws://127.0.0.1:{port}/?batch=1" + (f"&token={token}" if token else "")
        deadline = time.monotonic() + timeout_s
        self._stack = contextlib.ExitStack()
        while True:
            try:
                # a short close: the stream read only at a set may leave the server's close behind it
                self.ws = self._stack.enter_context(connect(url, open_timeout=5, close_timeout=1, max_size=MAX_FRAME))
                break
            except (OSError, TimeoutError) as exc:  # the plugin's server may start after the HTTP one
                if time.monotonic() > deadline:
                    raise EngineError(f"no pdtop control port on {port}: {exc}") from None
                time.sleep(0.25)
            except InvalidHandshake as exc:  # something else listens there: it will not turn into pdtop
                raise EngineError(f"no pdtop control port on {port}: {exc}") from None
        self.timeout_s, self._id = timeout_s, 0
        hello = self._next(lambda e: e.get("type") == "hello", "hello")
        engine = hello.get("engine") or {}
        if hello.get("readonly") or not isinstance(engine.get("config"), dict):
            self.close()
            raise EngineError(f"the server on control port {port} takes no control (read-only, or no engine)")
        self.config: dict[str, Any] = engine["config"]

    def _next(self, wanted: Any, what: str) -> dict[str, Any]:
        """Frames until one `wanted(event)` is true (config events update `config` on the way)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlRefused(f"no {what} from the server in {self.timeout_s:g} s")
            try:
                frame = self.ws.recv(timeout=left)
            except TimeoutError:
                continue
            except ConnectionClosed as exc:  # the server went away
                raise ControlRefused(f"the control connection closed: {exc}") from None
            try:
                event = json.loads(frame)
            except (ValueError, TypeError):
                continue
            if not isinstance(event, dict):
                continue
            if event.get("type") == "config" and isinstance(event.get("config"), dict):
                self.config = event["config"]
            if wanted(event):
                return event

    def value(self, key: str) -> Any:
        """A knob in force (a cap the server does not report is 0: off)."""
        return self.config.get(key, 0 if key == "max_split_forward_layers" else None)

    def set(self, changes: dict[str, Any]) -> None:
        """Set `changes` and wait until the configuration in force holds them; ControlRefused otherwise."""
        todo = {k: v for k, v in changes.items() if self.value(k) != v}
        if not todo:
            return
        self._id += 1
        ident = f"tune-{self._id}"
        self.ws.send(json.dumps(to_wire(Set(**todo), ident)))
        reply = self._next(lambda e: e.get("type") == "reply" and e.get("id") == ident, "reply")
        if not reply.get("ok"):
            error = reply.get("error") or {}
            raise ControlRefused(f"the server refused set {', '.join(todo)}: {error.get('reason', 'no reason')}")
        if all(self.value(k) == v for k, v in todo.items()):
            return
        self._next(lambda e: e.get("type") == "config" and all(self.value(k) == v for k, v in todo.items()),
                   "configuration change")

    def close(self) -> None:
        try:
            self._stack.close()
        except (OSError, ConnectionClosed):  # already gone
            pass
