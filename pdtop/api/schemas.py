"""The request bodies of `/v1/chat/completions` and `/v1/completions`, as OpenAI and vLLM take them.

Checked with pydantic in strict mode (no "5" for 5, no NaN or infinities); the first problem
is a 400 naming its field. A body is first counted (`body_shape`): one that would take long to
parse is refused before it is. Fields of OpenAI's API that pdtop does not implement are accepted
only at their default value (`n: 1`, no top logprobs, no tools, ...), so a client never silently
gets less than it asked for; fields OpenAI does not have are ignored, as vLLM does, except vLLM's
sampling extensions, which pdtop implements with vLLM 0.33's meaning and range: `ignore_eos`,
`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`,
`include_stop_str_in_output`. A completion's `logprobs: 0` gives each sampled token's
log-probability, as vLLM 0.33 does.
"""
from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdtop.api.body_shape import check_shape
from pdtop.api.errors import bad_request

MAX_BODY_BYTES = 8 << 20  # a whole 128K-token prompt as token ids fits
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024  # stop_token_ids per request (vLLM has no bound; pdtop bounds what a body costs)

VLLM = "vLLM 0.33"  # whose meaning and ranges the extensions below follow; their 400s say so
VLLM_FIELDS = {  # vLLM's extensions -> what vLLM 0.33 takes
    "ignore_eos": "a boolean", "include_stop_str_in_output": "a boolean",
    "top_k": "an integer, 0 or -1 (off) or at least 1", "min_p": "a number in [0, 1]",
    "repetition_penalty": "a finite number above 0", "min_tokens": "an integer in [0, max_tokens]",
    "stop_token_ids": "a list of the model's token ids",
}

# OpenAI fields pdtop does not implement -> the values that mean "not used" (type and value must match)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "suffix": (None, ""),
    "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": (None, {}),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "modalities": (None, ["text"]), "audio": (None,),
    "prediction": (None,),
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": self.role, "content": content}


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extensions, with vLLM 0.33's meaning and range (`SamplingParams` in pdtop/engine/request.py)
    ignore_eos: bool = False  # generate max_tokens whatever the model says
    top_k: int | None = Field(None, ge=-1)  # 0 or -1: off
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]  # the lists of prompts: of one (prompts.py)
    logprobs: bool | int | None = None  # 0: each sampled token's; more than 0 is refused (`UNSUPPORTED`)

    @property
    def wants_logprobs(self) -> bool:
        return type(self.logprobs) is int


Body = TypeVar("Body", ChatRequest, CompletionRequest)
_FIELD = re.compile(r"^[a-z_]+$")
_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def parse_body(raw: bytes, content_type: str | None, model: type[Body]) -> Body:
    """The request body as `model`, or APIError 400 naming what is wrong."""
    if not (content_type or "").split(";")[0].strip().lower() == "application/json":
        raise bad_request(None, "Content-Type must be application/json")
    if len(raw) > MAX_BODY_BYTES:
        raise bad_request(None, f"request body over {MAX_BODY_BYTES} bytes")
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads reads bytes
    except UnicodeDecodeError as exc:
        raise bad_request(None, f"malformed JSON: {str(exc)[:120]}") from None
    check_shape(text)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad_request(None, f"malformed JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise bad_request(None, "the request body must be a JSON object")
    for name, defaults in UNSUPPORTED.items():
        if name in obj and not any(type(obj[name]) is type(d) and obj[name] == d for d in defaults):
            raise bad_request(name, f"not supported by pdtop (only {_show(defaults)})")
    try:
        body = model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = _param(first["loc"])
        takes = VLLM_FIELDS.get((param or "").split(".")[0])
        raise bad_request(param, first["msg"] + (f" ({VLLM} takes {takes})" if takes else "")) from None
    stops = body.stops
    if len(stops) > MAX_STOP or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request("stop", f"at most {MAX_STOP} strings of 1..{MAX_STOP_CHARS} characters")
    if len(body.stop_token_ids or ()) > MAX_STOP_TOKEN_IDS:
        raise bad_request("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids (pdtop's bound on what a request "
                                            f"costs; {VLLM} has none)")
    return body


def _param(loc: tuple[Any, ...]) -> str | None:
    """`messages.0.content` from pydantic's location, without the union-member tags it adds."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and _FIELD.match(part) and part not in _TYPE_TAGS):
            parts.append(str(part))
        else:
            break
    return ".".join(parts) or None


def _show(defaults: tuple[Any, ...]) -> str:
    return " or ".join(json.dumps(d) for d in defaults)
