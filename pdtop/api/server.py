"""`ApiServer`: the API app on uvicorn, inside the caller's running event loop.

The socket is bound here (port 0 picks one), so `url` is known once `start` returns.
uvicorn's own signal handling is left out: the command that runs the server owns Ctrl-C.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn

from pdtop.api.app import Served, create_app
from pdtop.api.connections import ConnectionLimits, protocol_class
from pdtop.api.metrics import EngineMetrics
from pdtop.api.origins import OriginGuard, loopback_host
from pdtop.quiet_log import QuietLog
from pdtop.token_gate import GuessBudget, TokenGate

if TYPE_CHECKING:  # annotations only
    from pdtop.engine.engine import Engine
    from pdtop.engine.model.tokenizer import Tokenizer


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def default_tokenizer() -> Tokenizer:
    """The default model's tokenizer: text for engines whose model has none (synthetic, simulated)."""
    from pdtop.engine.model.loader import default_model_path
    from pdtop.engine.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf(default_model_path())


class ApiServer:
    """Serve `engine` over HTTP on host:port. `token`: `/v1/*` requests need `Authorization: Bearer TOKEN`
    (the command requires one for a non-loopback host); `guesses`: where wrong ones are counted (`pdtop
    serve` shares one with its websocket server). `allow_origins`: browser origins allowed (`origins.py`;
    on a loopback host the Host header must name loopback too). `limits`: what one connection and one
    client may hold (`connections.py`). `start()` in a running loop, `stop()` to finish."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
                 tokenizer: Tokenizer | None = None, limits: ConnectionLimits | None = None,
                 allow_origins: Sequence[str] = (), guesses: GuessBudget | None = None):
        self.engine, self.host, self.port = engine, host, port
        self.limits = limits or ConnectionLimits()
        self.gate = TokenGate(token, guesses)
        self.quiet = QuietLog(logging.getLogger("pdtop.api"))
        self.metrics = EngineMetrics(engine)
        self.served = Served(engine, tokenizer or engine.tokenizer or default_tokenizer(), self.metrics)
        self.app = OriginGuard(create_app(self.served, self.quiet), allow_origins,
                               check_host=loopback_host(host), quiet=self.quiet)
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL: http://HOST:PORT/v1."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind (OSError if it cannot) and serve; the engine's metrics sink is registered here."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY then
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                http=protocol_class(self.limits, self.gate, self.quiet), ws="none",
                                timeout_keep_alive=5, timeout_graceful_shutdown=2, backlog=1024)
        self._server = _Uvicorn(config)
        self.engine.add_sink(self.metrics.sink)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="pdtop-api")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError(f"the API server on {self.host}:{self.port} stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.engine.remove_sink(self.metrics.sink)
        if self._server is not None and self._task is not None:
            self.served.end_all()  # open streams finish now, not at the graceful timeout
            self._server.should_exit = True
            await self._task
            self._server = self._task = None
        self.quiet.flush()

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
