"""One streaming request to an OpenAI-compatible server, sent and measured as `vllm bench serve` 0.33
sends and measures it (`vllm/benchmarks/lib/endpoint_request_func.py`), and read as a hostile server
may answer it.

- Backends, vLLM's names: `openai` and `vllm` POST `{"model", "prompt", "max_tokens", "stream": true,
  "stream_options": {"include_usage": true}}` to a `.../completions` URL; `openai-chat` POSTs
  `{"messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
  "max_completion_tokens"}` to `.../chat/completions`. The sampling parameters and `ignore_eos` go
  into the body.
- Measured as vLLM measures: TTFT at the first chunk with output (a completions chunk with
  `choices`; a chat chunk whose delta has content, not the role-only opening one), an ITL at each
  later one, the latency at the last; the server's `usage` counts the tokens when it sends them.
- `served_model`: the first model `GET {base}/v1/models` lists, its `id` to send and its `root`
  for the result's `model_id` (vLLM 0.33 reads both).

A server is not trusted. A line of the stream is at most MAX_LINE_BYTES, a response at most
`4 * max_tokens + EXTRA_LINES` lines and `TEXT_CHARS_PER_TOKEN * max_tokens + EXTRA_TEXT` characters of
text (what a request keeps: its text and one float a token), a `/v1/models` answer MAX_BODY_BYTES
and an error body ERROR_BODY_BYTES. Once a stream has sent its first token, STALL_S of silence
ends it; before that a request waits up to REQUEST_TIMEOUT_S (vLLM's six hours: a queued request's
first token may be long in coming). Compressed answers are refused (`Accept-Encoding: identity`
is asked for: a compressed stream could expand past every bound at once). A request that breaks
a bound fails with one line saying which; what the server said is shown with its control
characters made visible (`shown`).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pdtop.visible import visible

if TYPE_CHECKING:  # httpx loads with the first request: `pdtop bench --help` stays fast
    import httpx

# vLLM 0.33's request functions for text generation: backend -> the URL's ending it checks for
BACKENDS = {"openai": "completions", "vllm": "completions", "openai-chat": "chat/completions"}
MAX_LINE_BYTES = 256 << 10
EXTRA_LINES = 4096  # besides four a token (an event and its blank line are two): role chunk, usage, pings
TEXT_CHARS_PER_TOKEN = 256  # a token's text is a few characters; the longest vocabulary entries ~100
EXTRA_TEXT = 64 << 10
MAX_BODY_BYTES = 1 << 20  # GET /v1/models
ERROR_BODY_BYTES = 4 << 10
SHOWN_CHARS = 200  # of an error body or message
STALL_S = 300.0
REQUEST_TIMEOUT_S = 6 * 60 * 60  # vLLM's aiohttp ClientTimeout(total=6 h)
MODELS_TIMEOUT_S = 60.0
MAX_MODEL_CHARS = 1024
MAX_TOKEN_COUNT = 1 << 53  # a usage count above this is no count
PLAIN = {"Accept-Encoding": "identity"}


class _Deadline:
    """Cancels the task it is made in at a loop time that can be moved (what `asyncio.timeout_at` does,
    which Python 3.10 lacks); `expired` tells its cancellation from anyone else's."""

    def __init__(self, when: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.expired = False
        self._handle = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._task.cancel()

    def move(self, when: float) -> None:
        self._handle.cancel()
        self._handle = self._loop.call_at(when, self._expire)

    def stop(self) -> None:
        self._handle.cancel()


class ServerError(Exception):
    """The server's answer is not one pdtop can use (one line, shown safely)."""


def server_base(url: str) -> str:
    """The server's base URL from `http://HOST:PORT`, `http://HOST:PORT/v1` or either with a path before:
    what vLLM's `--base-url` is (no `/v1`)."""
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""  # visible(): safe to print
    text: str = ""  # the streamed output
    start_time: float = 0.0  # time.perf_counter() when the request was sent
    queue_time: float = 0.0  # seconds it waited for a --max-concurrency slot before that (vLLM's client_queue_time)

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def meets(self, goodput: dict[str, float]) -> bool:
        """Every SLO (metric -> ms) met, as vLLM's `calculate_metrics` counts it: the SLO in seconds
        against the value, a value equal to its SLO meeting it."""
        value = {"ttft": self.ttft, "tpot": self.tpot, "e2el": self.latency}
        return all(slo / 1e3 >= value[k] for k, slo in goodput.items())


@dataclass
class Endpoint:
    """Where and how every request of a run is sent."""

    url: str  # the completions or chat completions URL
    model: str  # the name requests carry
    backend: str = "openai"  # a key of BACKENDS
    ignore_eos: bool = False
    sampling: dict[str, float] = field(default_factory=lambda: {"temperature": 0.0})
    stall_s: float = STALL_S


def _body(ep: Endpoint, text: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ep.model}
    if ep.backend == "openai-chat":
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        body["max_completion_tokens"] = max_tokens
    else:
        body["prompt"] = text
        body["max_tokens"] = max_tokens
    body.update(stream=True, stream_options={"include_usage": True})
    if ep.ignore_eos:
        body["ignore_eos"] = True
    return {**body, **ep.sampling}


async def _head(r: httpx.Response, limit: int) -> bytes:
    """The first `limit` bytes of the body, no more read."""
    out = bytearray()
    async for chunk in r.aiter_raw():
        out += chunk
        if len(out) >= limit:
            break
    return bytes(out[:limit])


async def _lines(r: httpx.Response) -> AsyncIterator[bytes]:
    """The body's lines (no line end), each at most MAX_LINE_BYTES."""
    if r.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        raise ServerError(f"the server compressed its stream ({visible(r.headers['content-encoding'][:40])}) "
                          "though asked not to")
    buf = bytearray()
    async for chunk in r.aiter_raw():
        scan = len(buf)
        buf += chunk
        while (end := buf.find(b"\n", scan)) >= 0:
            if end > MAX_LINE_BYTES:
                break
            line = bytes(buf[:end])
            del buf[:end + 1]
            scan = 0
            yield line[:-1] if line.endswith(b"\r") else line
        if len(buf) > MAX_LINE_BYTES:
            raise ServerError(f"the server sent a line over {MAX_LINE_BYTES} bytes")
    if buf:
        yield bytes(buf)


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_TOKEN_COUNT:
        raise ServerError(f"usage.{key} is not a token count")
    return value


def _output(choice: object, chat: bool) -> str | None:
    """The text a streamed choice carries ("" for a token without text), None if it carries no output:
    vLLM's rules (a completions choice always counts; a chat delta with content, reasoning or a tool
    call, or an empty content without a role)."""
    if not isinstance(choice, dict):
        raise ServerError("a chunk's choices are not objects")
    if chat:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        has = any(delta.get(k) for k in ("content", "reasoning", "tool_calls", "function_call")) or (
            delta.get("content") == "" and "role" not in delta)
        if not has:
            return None
        text = delta.get("content")
    else:
        text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise ServerError("a chunk's text is not a string")
    return text or ""


async def stream_request(client: httpx.AsyncClient, ep: Endpoint, text: str, max_tokens: int,
                         prompt_tokens: int = 0, on_first: Callable[[], None] | None = None) -> RequestResult:
    """One streaming request, measured: TTFT, each token gap, latency, the text; `on_first()` is called at
    its first token. A failure is in the result (`ok` False, `error` one shown line), not raised."""
    import httpx

    chat = ep.backend == "openai-chat"
    res = RequestResult(ok=False, prompt_tokens=prompt_tokens)
    most_lines, most_chars = 4 * max_tokens + EXTRA_LINES, TEXT_CHARS_PER_TOKEN * max_tokens + EXTRA_TEXT
    chunks, lines, chars, pieces = 0, 0, 0, []
    loop = asyncio.get_running_loop()
    give_up = loop.time() + REQUEST_TIMEOUT_S
    deadline = _Deadline(give_up)
    sent = last = res.start_time = time.perf_counter()
    try:
        async with client.stream("POST", ep.url, json=_body(ep, text, max_tokens), headers=PLAIN) as r:
            if r.status_code != 200:
                deadline.move(min(give_up, loop.time() + ep.stall_s))
                body = (await _head(r, ERROR_BODY_BYTES)).decode(errors="replace")
                res.error = visible(f"HTTP {r.status_code}: {body[:SHOWN_CHARS]}")
                return res
            async for line in _lines(r):
                if chunks:  # a started stream may not fall silent
                    deadline.move(min(give_up, loop.time() + ep.stall_s))
                lines += 1  # every line counts: blank ones and comments (pings) could come without end too
                if lines > most_lines:
                    raise ServerError(f"the stream ran past {most_lines} lines for max_tokens {max_tokens}")
                if not line.startswith(b"data:"):  # event separators, comments, event:/id:/retry: fields
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                data = json.loads(payload)
                if not isinstance(data, dict):
                    raise ServerError("an event is not a JSON object")
                if "error" in data:
                    error = data["error"]
                    message = error.get("message", error) if isinstance(error, dict) else error
                    res.error = visible(f"the server: {str(message)[:SHOWN_CHARS]}")
                    return res
                if isinstance(usage := data.get("usage"), dict):
                    if (n := _count(usage, "prompt_tokens")) is not None:
                        res.prompt_tokens = n
                    if (n := _count(usage, "completion_tokens")) is not None:
                        res.output_tokens = n
                choices = data.get("choices")
                if not choices:
                    continue
                if not isinstance(choices, list):
                    raise ServerError("a chunk's choices are not a list")
                piece = _output(choices[0], chat)
                if piece is None:
                    continue
                if chunks == 0:
                    res.ttft = now - sent
                    if on_first is not None:
                        on_first()
                else:
                    res.itls.append(now - last)
                chunks, last, chars = chunks + 1, now, chars + len(piece)
                if chars > most_chars:
                    raise ServerError(f"the stream ran past {most_chars} characters for max_tokens {max_tokens}")
                pieces.append(piece)
        res.latency = last - sent
        res.output_tokens = res.output_tokens or chunks
        res.text = "".join(pieces)
        res.ok = chunks > 0
        res.error = "" if res.ok else "no tokens streamed"
    except asyncio.CancelledError:
        if not deadline.expired:
            raise
        uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python 3.11+: the cancel is handled
        if uncancel is not None:
            uncancel()
        res.error = (f"the stream fell silent for {ep.stall_s:g} s" if chunks else
                     f"no token within {REQUEST_TIMEOUT_S} s")
    except RecursionError:
        res.error = "an event is nested deeper than the JSON parser goes"
    except ServerError as exc:
        res.error = str(exc)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        res.error = visible(f"{type(exc).__name__}: {exc}"[:SHOWN_CHARS])
    finally:
        deadline.stop()
    return res


async def served_model(client: httpx.AsyncClient, base: str) -> tuple[str, str]:
    """(id, root) of the first model `GET {base}/v1/models` lists (a server that sends no `root`: its id);
    ServerError (one shown line) when the answer is not such a list, is over MAX_BODY_BYTES or takes
    over MODELS_TIMEOUT_S."""
    url = f"{base}/v1/models"
    async def get() -> tuple[int, str, bytes]:
        async with client.stream("GET", url, headers=PLAIN) as r:
            body = await _head(r, MAX_BODY_BYTES + 1)
            return r.status_code, r.headers.get("content-encoding", "identity").lower(), body

    try:
        status, encoding, body = await asyncio.wait_for(get(), MODELS_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ServerError(f"GET {url}: no answer within {MODELS_TIMEOUT_S:g} s") from None
    if status != 200:
        raise ServerError(visible(f"GET {url}: HTTP {status}: {body[:SHOWN_CHARS].decode(errors='replace')}"))
    if encoding not in ("", "identity"):
        raise ServerError(f"GET {url}: the answer is compressed though asked not to be")
    if len(body) > MAX_BODY_BYTES:
        raise ServerError(f"GET {url}: the answer is over {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ServerError(f"GET {url}: the answer is not JSON") from None
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models else None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str) or not first["id"]:
        raise ServerError(f"GET {url}: no model listed (vLLM reads data[0].id)")
    name, root = first["id"], first.get("root")
    root = root if isinstance(root, str) and root else name
    if max(len(name), len(root)) > MAX_MODEL_CHARS:
        raise ServerError(f"GET {url}: a model name over {MAX_MODEL_CHARS} characters")
    return name, root
