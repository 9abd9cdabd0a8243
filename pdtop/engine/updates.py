"""Tokens back to the callers of `Engine.enqueue`: after each round, every watched request that
got tokens (or finished) is reported once, on the engine thread."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pdtop.engine.request import Request

log = logging.getLogger("pdtop.engine")


@dataclass(frozen=True)
class TokenUpdate:
    """What an enqueued request got since its last update: new tokens, and on the last update why it ended."""

    tokens: list[int]
    finish_reason: str | None = None  # "eos" | "length" | "stop" | "abort" | "rejected" on the last update
    error: str | None = None  # why it was rejected
    logprobs: list[float] | None = None  # each new token's, when the request asked (`SamplingParams.logprobs`)


OnUpdate = Callable[[TokenUpdate], "bool | None"]  # True: end the request now, finish reason "stop"


@dataclass(eq=False)
class _Watch:
    req: Request
    on_update: OnUpdate
    sent: int = 0  # tokens reported so far


class Watchers:
    """The requests whose callers wait for their tokens (engine thread only)."""

    def __init__(self) -> None:
        self._watched: list[_Watch] = []

    def __bool__(self) -> bool:
        return bool(self._watched)

    def add(self, req: Request, on_update: OnUpdate) -> None:
        self._watched.append(_Watch(req, on_update))

    def notify(self, stop: Callable[[Request], None]) -> None:
        """Tell each caller what its request got this round; `stop(req)` ends one whose caller
        asked (a stop string matched). Finished requests are forgotten."""
        keep = []
        for w in self._watched:
            req = w.req
            n = len(req.output_ids)
            if n > w.sent or req.finished:
                update = TokenUpdate(req.output_ids[w.sent:n], req.finish_reason if req.finished else None, req.error,
                                     req.logprobs[w.sent:n] if req.params.logprobs else None)
                w.sent = n
                try:
                    wants_stop = w.on_update(update)
                except Exception:  # a caller's bug must not stop the engine
                    log.exception("on_update of request %d", req.id)
                    wants_stop = False
                if wants_stop and not req.finished:
                    stop(req)
            if not req.finished:
                keep.append(w)
        self._watched = keep
