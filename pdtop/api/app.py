"""The routes: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, `/health`, `/metrics`.

A request is checked (400 naming the field, 404 for another model), tokenized (chat through
the model's own template), then enqueued in the engine (503 with Retry-After when the waiting
queue is full). Streaming answers are server-sent events, one chunk per engine round, then
`data: [DONE]`. A client that goes away aborts its request, which frees its KV at the next
round boundary. With a token, `/v1/*` needs `Authorization: Bearer TOKEN` (as vLLM's `--api-key`):
checked by the connection (`connections.py`) before the body is read.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from pdtop.api.answers import answer
from pdtop.api.errors import APIError, bad_request
from pdtop.api.metrics import EngineMetrics
from pdtop.api.prompts import chat_prompt, completion_prompts
from pdtop.api.schemas import MAX_BODY_BYTES, VLLM, VLLM_FIELDS, Body, ChatRequest, CompletionRequest, parse_body
from pdtop.api.streams import Chunk, Completion, Mailbox
from pdtop.engine.errors import PromptError, QueueFullError
from pdtop.engine.request import SamplingParams
from pdtop.quiet_log import QuietLog

if TYPE_CHECKING:  # annotations only
    from pdtop.engine.engine import Engine
    from pdtop.engine.model.tokenizer import Tokenizer

log = logging.getLogger("pdtop.api")
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context
INLINE_BODY_BYTES = 64 << 10  # bodies up to this size are parsed on the event loop (well under a millisecond)


class Served:
    """What the routes share: the engine, its tokenizer and metrics, the served model's id."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, metrics: EngineMetrics):
        self.engine, self.tokenizer, self.metrics = engine, tokenizer, metrics
        self.model_id: str = engine.model_name
        self.root: str = engine.model_path  # vLLM's `root`: what the model was loaded from (its bench reads it)
        self.context: int = engine.executor.cfg.max_context
        self.created = int(time.time())
        self._mailbox: Mailbox | None = None  # made on the event loop, at the first request
        self.answering: weakref.WeakSet[Completion] = weakref.WeakSet()  # what `end_all` ends

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise APIError(404, f"model {model!r} not found; this server serves {self.model_id!r}", param="model",
                           code="model_not_found")

    def params(self, body: ChatRequest | CompletionRequest, prompt_tokens: int, field: str) -> SamplingParams:
        """The sampling parameters of a request with a prompt of `prompt_tokens` (400 if it cannot run)."""
        if prompt_tokens >= self.context:
            raise bad_request(field, f"{prompt_tokens} prompt tokens; the model's context is {self.context} tokens")
        name, max_tokens = "max_tokens", body.max_tokens
        if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
            name, max_tokens = "max_completion_tokens", body.max_completion_tokens
        room = self.context - prompt_tokens
        if max_tokens is None:
            max_tokens = room if isinstance(body, ChatRequest) else min(COMPLETIONS_MAX_TOKENS, room)
        elif max_tokens > room:
            raise bad_request(name, f"{max_tokens} + {prompt_tokens} prompt tokens exceed the model's context of "
                                    f"{self.context} tokens")
        if body.min_tokens > max_tokens:
            raise bad_request("min_tokens", f"{body.min_tokens} is over max_tokens={max_tokens} "
                                            f"({VLLM} takes {VLLM_FIELDS['min_tokens']})")
        vocab = self.engine.executor.cfg.vocab
        stop_ids = frozenset(body.stop_token_ids or ())
        if bad := sorted(t for t in stop_ids if not 0 <= t < vocab)[:8]:
            raise bad_request("stop_token_ids", f"token id(s) {bad} outside the vocabulary of {vocab} "
                                                f"({VLLM} takes {VLLM_FIELDS['stop_token_ids']})")
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        params = SamplingParams(temperature=body.temperature, top_p=body.top_p, seed=seed, max_tokens=max_tokens,
                                ignore_eos=body.ignore_eos, top_k=body.top_k or 0, min_p=body.min_p or 0.0,
                                repetition_penalty=body.repetition_penalty or 1.0, min_tokens=body.min_tokens,
                                stop_token_ids=stop_ids,
                                logprobs=isinstance(body, CompletionRequest) and body.wants_logprobs)
        try:
            self.engine.executor.check_request(prompt_tokens, params)
        except PromptError as exc:
            raise bad_request(name, str(exc)) from None
        return params

    def start(self, prompts: list[list[int]], body: ChatRequest | CompletionRequest, field: str) -> list[Completion]:
        """Enqueue one request per prompt in the engine (all or none): the choices, read from the event loop
        through one queue."""
        params = [self.params(body, len(p), field) for p in prompts]
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        choices: list[Completion] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                choices.append(self._start(prompt, p, body, queue, i))
        except APIError:
            for c in choices:
                self.abort(c)
            raise
        return choices

    def _start(self, prompt_ids: list[int], params: SamplingParams, body: ChatRequest | CompletionRequest,
               queue: asyncio.Queue[Chunk], index: int) -> Completion:
        if self._mailbox is None:
            self._mailbox = Mailbox(asyncio.get_running_loop())
        completion = Completion(self._mailbox, self.tokenizer, body.stops, queue, index,
                                include_stop=body.include_stop_str_in_output, min_tokens=params.min_tokens,
                                logprobs=params.logprobs)
        self.answering.add(completion)
        try:
            completion.request = self.engine.enqueue(prompt_ids, params, source="api",
                                                     on_update=completion.on_update)
        except QueueFullError as exc:
            raise APIError(503, str(exc), type="server_error", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after)}) from None
        return completion

    def end_all(self) -> None:
        """Event loop, as the server stops: every answer still open ends now."""
        for completion in list(self.answering):
            completion.end_now()

    def abort(self, completion: Completion) -> None:
        if completion.request is not None:
            self.engine.abort(completion.request)


class _ClientGone(Exception):
    """The client left before its request was read: nobody to answer."""


def create_app(served: Served, quiet: QuietLog | None = None) -> FastAPI:
    """The routes. `quiet`: where what clients can repeat is logged (once per kind, then counted)."""
    app = FastAPI(title="pdtop", docs_url=None, redoc_url=None, openapi_url=None)
    quiet = quiet or QuietLog(log)
    parsing = asyncio.Semaphore(1)  # large bodies parsed at once (`_parse`)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(_ClientGone)
    async def client_gone(request: Request, exc: _ClientGone) -> Response:
        quiet.warning("client_disconnect", "a client left before its request was read (%s %s)", request.method,
                      request.url.path)
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        quiet.warning("internal: " + type(exc).__name__, "%s %s", request.method, request.url.path, exc_info=exc)
        return APIError(500, f"internal error: {type(exc).__name__}", type="server_error").response()

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(served.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.model_id, "object": "model", "created": served.created,
                                            "owned_by": "pdtop", "root": served.root, "parent": None,
                                            "max_model_len": served.context}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await _parse(request, ChatRequest, parsing)
        served.check_model(body.model)
        prompt = await chat_prompt(body, served.tokenizer, served.context)
        return await answer(request, served.model_id, served.abort, served.start([prompt], body, "messages"), body,
                            len(prompt), True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest, parsing)
        served.check_model(body.model)
        prompts = await completion_prompts(body, served.tokenizer, served.context)
        return await answer(request, served.model_id, served.abort, served.start(prompts, body, "prompt"), body,
                            sum(len(p) for p in prompts), False)

    return app


async def _parse(request: Request, model: type[Body], one_at_a_time: asyncio.Semaphore) -> Body:
    """The body, checked. A large one on a worker thread, one such at a time: parsing holds the GIL, but
    only for one bounded C call at a time (`body_shape`), so the event loop takes turns with it (with
    several parsing threads it would wait for each of theirs)."""
    raw, content_type = await _read(request), request.headers.get("content-type")
    if len(raw) <= INLINE_BODY_BYTES:
        return parse_body(raw, content_type, model)
    async with one_at_a_time:
        return await asyncio.to_thread(parse_body, raw, content_type, model)


async def _read(request: Request) -> bytes:
    """The body, refused past MAX_BODY_BYTES without reading the rest."""
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise bad_request(None, f"request body over {MAX_BODY_BYTES} bytes")
            parts.append(part)
    except ClientDisconnect:
        raise _ClientGone from None
    return b"".join(parts)
