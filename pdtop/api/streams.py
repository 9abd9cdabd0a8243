"""One API request in flight, between the engine thread and the event loop.

The engine calls `Completion.on_update` on its own thread after each round that gave the
request tokens (`Engine.enqueue`). There the tokens become text with the model's stream
decoder (as `pdtop generate` prints it: the end-of-sequence or stop token is not text unless
`include_stop_str_in_output`) and stop strings are looked for; a match returns True, and the
engine ends the request before its next round, so no token is generated past the stop. Stop
strings follow vLLM 0.33's detokenizer: the one that completes first wins, none counts before
`min_tokens` tokens, and `include_stop_str_in_output` keeps it in the text. The text reaches
the event loop as one `Chunk` per round in the asyncio queue the handler reads, through a
`Mailbox` that wakes the loop once for all the requests of a round.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pdtop.engine.request import Request
from pdtop.engine.updates import TokenUpdate

if TYPE_CHECKING:  # annotations only
    from pdtop.engine.model.tokenizer import Tokenizer

# the engine's finish reasons -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort", "rejected": "error"}


@dataclass(frozen=True)
class TokenLogprobs:
    """A completion's `logprobs` object as vLLM 0.33 writes it for `logprobs: 0`: each token (decoded
    alone), its log-probability (floored at -9999, as vLLM does for -inf), and its text offset."""
    tokens: list[str]
    logprobs: list[float | None]
    offsets: list[int]

    def openai(self) -> dict[str, list[Any]]:
        return {"text_offset": self.offsets, "token_logprobs": self.logprobs, "tokens": self.tokens,
                "top_logprobs": [{t: lp} if lp is not None else None for t, lp in zip(self.tokens, self.logprobs,
                                                                                       strict=True)]}

    @staticmethod
    def joined(parts: list[TokenLogprobs]) -> TokenLogprobs:
        return TokenLogprobs([t for p in parts for t in p.tokens], [x for p in parts for x in p.logprobs],
                             [o for p in parts for o in p.offsets])


@dataclass(frozen=True)
class Chunk:
    text: str  # new text (may be empty: a token that ends mid-character, or text held back for a stop string)
    completion_tokens: int  # tokens generated so far
    finish_reason: str | None = None  # OpenAI's ("stop", "length"), on the last chunk
    error: str | None = None  # why the engine rejected the request
    index: int = 0  # the choice it belongs to (a request's prompts share one queue)
    logprobs: TokenLogprobs | None = None  # the round's tokens', when asked


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
                 queue: asyncio.Queue[Chunk] | None = None, index: int = 0, *, include_stop: bool = False,
                 min_tokens: int = 0, logprobs: bool = False):
        self.queue: asyncio.Queue[Chunk] = queue if queue is not None else asyncio.Queue()
        self.index = index
        self.request: Request | None = None  # set by the caller once enqueued (for `Engine.abort`)
        self._mailbox = mailbox
        self._tokenizer = tokenizer
        self._decoder = tokenizer.stream_decoder(skip_special=True)  # as vLLM by default (skip_special_tokens)
        self._stops = list(stops)
        self._include_stop = include_stop  # stop strings and tokens stay in the text
        self._min_tokens = min_tokens  # no stop string counts before this many tokens
        self._logprobs = logprobs
        self._offset = 0  # text offset of the next token in `logprobs` (the tokens' own lengths, as vLLM)
        self._held = ""  # text that may be the start of a stop string, not sent yet
        self._tail = ""  # with include_stop: text sent that may be the start of a stop string
        self._tokens = 0
        self._done = False

    def on_update(self, update: TokenUpdate) -> bool:
        """Engine thread: the request's new tokens -> one chunk. True: a stop string matched, end it now."""
        if self._done:
            return False
        tokens = update.tokens
        before, self._tokens = self._tokens, self._tokens + len(tokens)
        logprobs = self._token_logprobs(tokens, update.logprobs) if self._logprobs else None
        if update.finish_reason == "eos" and not self._include_stop:
            tokens = tokens[:-1]
        pieces = [self._decoder.push(t) for t in tokens]
        text = self._held + "".join(pieces)
        if update.finish_reason is not None:
            text += self._decoder.flush()
        seen = self._tail + text  # with include_stop_str_in_output, text already sent may begin a stop string
        if self._stops and self._tokens > self._min_tokens:
            # a match must end past the text of the first min_tokens tokens (vLLM's rule)
            floor = len(self._tail) + len(self._held) + sum(map(len, pieces[:self._min_tokens - before])) \
                if before < self._min_tokens else 0
            match = self._find_stop(seen, floor)
            if match is not None:
                cut = match[1] if self._include_stop else match[0]
                self._finish(Chunk(text[:cut - len(self._tail)], self._tokens, "stop", logprobs=logprobs))
                return True
        if update.finish_reason is not None:
            reason = FINISH_REASONS.get(update.finish_reason, update.finish_reason)
            self._finish(Chunk(text, self._tokens, reason, update.error, logprobs=logprobs))
            return False
        held = self._partial_stop(seen)
        if self._include_stop:  # sent now, remembered for the search
            self._tail, held = (seen[len(seen) - held:] if held else ""), 0
        self._held = text[len(text) - held:] if held else ""
        self._post(Chunk(text[:len(text) - held], self._tokens, logprobs=logprobs))
        return False

    def _find_stop(self, text: str, floor: int) -> tuple[int, int] | None:
        """(start, end) of the stop string that ends first past `floor` (ties: the first listed), or None."""
        best: tuple[int, int] | None = None
        for stop in self._stops:
            i = text.find(stop, max(0, floor - len(stop) + 1))
            if i >= 0 and (best is None or i + len(stop) < best[1]):
                best = (i, i + len(stop))
        return best

    def _token_logprobs(self, tokens: list[int], logprobs: list[float] | None) -> TokenLogprobs:
        """The round's tokens as vLLM lists them (a stop or end token too), each decoded alone."""
        names = [self._tokenizer.decode([t]) for t in tokens]
        values: list[float | None] = [max(x, -9999.0) for x in logprobs or []]
        values += [None] * (len(names) - len(values))  # an executor that makes none (the simulator)
        offsets = []
        for name in names:
            offsets.append(self._offset)
            self._offset += len(name)
        return TokenLogprobs(names, values[:len(names)], offsets)

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
