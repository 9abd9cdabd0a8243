"""Caps on queued work: how many requests may wait for prefill, and how many prompt tokens they may hold.

Without them a flood (synthetic arrivals far above what the device serves, injected long
prompts, API clients) grows the waiting queue, and the memory its prompts hold, without
bound. Over a cap a new request is refused at once with `QueueFullError`: the API answers
503, a control message gets an error reply, a synthetic arrival is dropped and counted.
Requests already prefilling or decoding are not counted: KV admission bounds those.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.errors import FieldError, QueueFullError

# Defaults: far above what one device drains in a few seconds, far below what hurts memory
# (a waiting prompt costs about 8 bytes per token: 262,144 tokens are about 2 MB).
MAX_WAITING_REQUESTS = 1024
MAX_WAITING_TOKENS = 262_144


@dataclass(frozen=True)
class QueueLimits:
    max_waiting_requests: int = MAX_WAITING_REQUESTS  # requests queued and not yet prefilling
    max_waiting_tokens: int = MAX_WAITING_TOKENS  # their prompt tokens

    def __post_init__(self) -> None:
        for name in ("max_waiting_requests", "max_waiting_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FieldError(name, f"must be an integer >= 1, got {value!r}")

    def check(self, waiting: int, waiting_tokens: int, prompt_tokens: int) -> None:
        """QueueFullError if one more request of `prompt_tokens` would pass a cap. A prompt larger
        than the token cap still gets in when nothing waits, so every valid prompt can run."""
        if waiting >= self.max_waiting_requests:
            raise QueueFullError(f"waiting queue full: {waiting} requests waiting "
                                 f"(max_waiting_requests {self.max_waiting_requests})")
        if waiting and waiting_tokens + prompt_tokens > self.max_waiting_tokens:
            raise QueueFullError(f"waiting queue full: {waiting_tokens} prompt tokens waiting, "
                                 f"{prompt_tokens} more would pass max_waiting_tokens {self.max_waiting_tokens}")
