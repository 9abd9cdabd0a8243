"""A request's answer: one choice per prompt (a completion's `prompt` may list several, as vLLM takes it).

Whole: every choice collected, then one JSON object, `usage` summed. Streaming: server-sent events,
one chunk per choice and engine round, each naming its choice's `index`, then `data: [DONE]`.
The choices of a request share one queue (`Completion(queue=..., index=i)`). The chunks already
queued go out in one write: a stream that fell behind catches up in one step, and once its client
is gone it writes to the dead socket once, not once per chunk (asyncio logs every write after a
connection is lost: 200 dropped streams wrote 6,116 lines). A client that goes away aborts every
choice still running.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pdtop.api.errors import APIError
from pdtop.api.streams import Chunk, Completion, TokenLogprobs

if TYPE_CHECKING:  # annotations only
    from pdtop.api.schemas import ChatRequest, CompletionRequest

T = TypeVar("T")


async def answer(request: Request, model_id: str, abort: Callable[[Completion], None], choices: list[Completion],
                 body: ChatRequest | CompletionRequest, prompt_tokens: int, chat: bool) -> Response:
    """The response to a request whose `choices` run in the engine (they share one queue); `abort` ends a
    choice in the engine."""
    shape = _Shape(model_id, chat)
    if body.stream:
        return StreamingResponse(_events(abort, choices, shape, prompt_tokens, body.include_usage),
                                 media_type="text/event-stream")
    texts: list[list[str]] = [[] for _ in choices]
    logprobs: list[list[TokenLogprobs]] = [[] for _ in choices]
    lasts: dict[int, Chunk] = {}

    async def collect() -> None:
        while len(lasts) < len(choices):
            chunk = await choices[0].queue.get()
            texts[chunk.index].append(chunk.text)
            if chunk.logprobs is not None:
                logprobs[chunk.index].append(chunk.logprobs)
            if chunk.finish_reason is not None:
                lasts[chunk.index] = chunk

    if await _unless_disconnected(request, collect()) is None:  # the client went away
        for c in choices:
            abort(c)
        return Response(status_code=499)
    error = next((c.error for c in lasts.values() if c.error is not None), None)
    if error is not None:
        raise APIError(500, f"the engine rejected the request: {error}", type="server_error")
    return JSONResponse(shape.whole(["".join(t) for t in texts], [lasts[i] for i in range(len(choices))],
                                    prompt_tokens, [TokenLogprobs.joined(lp) if lp else None for lp in logprobs]))


async def _events(abort: Callable[[Completion], None], choices: list[Completion], shape: _Shape, prompt_tokens: int,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events; a client that goes away (the task is cancelled) aborts what still runs."""
    queue = choices[0].queue
    running = set(range(len(choices)))
    tokens = [0] * len(choices)
    failed = False
    try:
        if shape.chat:
            yield _sse(shape.chunk({"role": "assistant", "content": ""}, None, include_usage))
        while running and not failed:
            frames, chunk = [], await queue.get()
            while True:
                tokens[chunk.index] = chunk.completion_tokens
                if chunk.finish_reason is not None:
                    running.discard(chunk.index)
                if chunk.error is not None:
                    frames.append(_sse(APIError(500, f"the engine rejected the request: {chunk.error}",
                                                type="server_error").body()))
                    failed = True
                    break
                content = {"content": chunk.text} if shape.chat else chunk.text
                frames.append(_sse(shape.chunk(content, chunk.finish_reason, include_usage, chunk.index,
                                               chunk.logprobs)))
                if not running or queue.empty():
                    break
                chunk = queue.get_nowait()
            yield b"".join(frames)
        if include_usage:
            yield _sse(shape.usage_chunk(prompt_tokens, sum(tokens)))
        yield b"data: [DONE]\n\n"
    finally:
        for i in running:
            abort(choices[i])


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | bool | None:
    """`work`'s result (True if it has none), or None (work cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
    if task not in done:
        return None
    result = task.result()
    return True if result is None else result


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Shape:
    """OpenAI's response objects for one request: chat or text completion."""

    def __init__(self, model: str, chat: bool):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, content: Any, finish_reason: str | None, include_usage: bool, index: int = 0,
              logprobs: TokenLogprobs | None = None) -> dict[str, Any]:
        choice = {"index": index, ("delta" if self.chat else "text"): content,
                  "logprobs": None if logprobs is None else logprobs.openai(),
                  "finish_reason": finish_reason}
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": _usage(prompt_tokens, completion_tokens)}

    def whole(self, texts: list[str], lasts: list[Chunk], prompt_tokens: int,
              logprobs: list[TokenLogprobs | None]) -> dict[str, Any]:
        choices = []
        for i, (text, last, lp) in enumerate(zip(texts, lasts, logprobs, strict=True)):
            if self.chat:
                choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": i, "text": text}
            choice.update(logprobs=None if lp is None else lp.openai(), finish_reason=last.finish_reason)
            choices.append(choice)
        return {**self._head(self.object), "choices": choices,
                "usage": _usage(prompt_tokens, sum(last.completion_tokens for last in lasts))}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
