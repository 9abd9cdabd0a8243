"""One API request in flight, between the engine thread and the event loop.

The engine calls `Completion.on_update` on its own thread after each round that gave the
request tokens (`Engine.enqueue`). There the tokens become text with the model's stream
decoder (as `pdtop generate` prints it: the end-of-sequence token is not text) and stop
strings are looked for; a match returns True, and the engine ends the request before its
next round, so no token is generated past the stop. The text reaches the event loop as one
`Chunk` per round in the asyncio queue the handler reads, through a `Mailbox` that wakes the
loop once for all the requests of a round.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pdtop.engine.request import Request
from pdtop.engine.updates import TokenUpdate

if TYPE_CHECKING:  # annotations only
    from pdtop.engine.model.tokenizer import Tokenizer

# the engine's finish reasons -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort", "rejected": "error"}


@dataclass(frozen=True)
class Chunk:
    text: str  # new text (may be empty: a token that ends mid-character, or text held back for a stop string)
    completion_tokens: int  # tokens generated so far
    finish_reason: str | None = None  # OpenAI's ("stop", "length"), on the last chunk
    error: str | None = None  # why the engine rejected the request
    index: int = 0  # the choice it belongs to (a request's prompts share one queue)


class Mailbox:
    """Chunks from the engine thread to their queues on the event loop, with one `call_soon_threadsafe`
    (one wake-up of the loop) per batch rather than per request and round."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: deque[tuple[asyncio.Queue[Chunk], Chunk]] = deque()
        self._scheduled = False

    def post(self, queue: asyncio.Queue[Chunk], chunk: Chunk) -> None:
        """Engine thread."""
        self._items.append((queue, chunk))
        if not self._scheduled:  # a delivery scheduled, and not yet started, will take this item too
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False  # before taking: an item posted from here on schedules another delivery
        while self._items:
            queue, chunk = self._items.popleft()
            queue.put_nowait(chunk)


class Completion:
    """One choice of a request: `queue` (shared by the request's choices) gets its chunks, tagged `index`."""

    def __init__(self, mailbox: Mailbox, tokenizer: Tokenizer, stops: Sequence[str],
                 queue: asyncio.Queue[Chunk] | None = None, index: int = 0):
        self.queue: asyncio.Queue[Chunk] = queue if queue is not None else asyncio.Queue()
        self.index = index
        self.request: Request | None = None  # set by the caller once enqueued (for `Engine.abort`)
        self._mailbox = mailbox
        self._decoder = tokenizer.stream_decoder(skip_special=True)  # as vLLM by default (skip_special_tokens)
        self._stops = list(stops)
        self._held = ""  # text that may be the start of a stop string
        self._tokens = 0
        self._done = False

    def on_update(self, update: TokenUpdate) -> bool:
        """Engine thread: the request's new tokens -> one chunk. True: a stop string matched, end it now."""
        if self._done:
            return False
        tokens = update.tokens
        self._tokens += len(tokens)
        if update.finish_reason == "eos":
            tokens = tokens[:-1]
        text = self._held + "".join(self._decoder.push(t) for t in tokens)
        if update.finish_reason is not None:
            text += self._decoder.flush()
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=None)
        if cut is not None:
            self._finish(Chunk(text[:cut], self._tokens, "stop"))
            return True
        if update.finish_reason is not None:
            reason = FINISH_REASONS.get(update.finish_reason, update.finish_reason)
            self._finish(Chunk(text, self._tokens, reason, update.error))
            return False
        held = self._partial_stop(text)
        self._held = text[len(text) - held:] if held else ""
        self._post(Chunk(text[:len(text) - held], self._tokens))
        return False

    def end_now(self) -> None:
        """Event loop, as the server stops: end the answer ("abort") so its handler returns before uvicorn's
        graceful shutdown gives up on it (and logs a CancelledError traceback for each open stream)."""
        if not self._done:
            self._done = True
            self.queue.put_nowait(Chunk("", self._tokens, "abort", index=self.index))

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that begins a stop string (held back until it is decided)."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _finish(self, chunk: Chunk) -> None:
        self._done = True
        self._held = ""
        self._post(chunk)

    def _post(self, chunk: Chunk) -> None:
        self._mailbox.post(self.queue, replace(chunk, index=self.index) if self.index else chunk)
