"""A request's prompt as token ids, refused (400 naming the field) as early and as cheaply as possible.

A text that cannot fit the context is refused by its length before it is tokenized: one token
spans at most `Tokenizer.max_token_bytes` bytes and a character is at least one byte, so a text
of more than (context - 1) x that many characters is more than the context's tokens (an 8 MB
prompt took 9.2 s to tokenize and 1.9 GB of memory before it was refused by its count).
Tokenizing runs on a worker thread, without the GIL for long texts, so the event loop goes on.
Chat messages are tokenized with `Tokenizer.encode_chat`: special-token text in a message's
content stays text, so a user cannot forge a system or assistant turn.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from pdtop.api.errors import bad_request
from pdtop.engine.errors import EngineError

MAX_PROMPTS = 64  # prompts in one /v1/completions request (one choice each)

if TYPE_CHECKING:  # annotations only
    from pdtop.api.schemas import ChatRequest, CompletionRequest
    from pdtop.engine.model.tokenizer import Tokenizer


def check_text_size(chars: int, tokenizer: Tokenizer, context: int, field: str) -> None:
    """400 when `chars` characters are surely more tokens than the context holds."""
    most = (context - 1) * tokenizer.max_token_bytes
    if chars > most:
        raise bad_request(field, f"{chars} characters cannot fit the model's context of {context} tokens (a token "
                                 f"spans at most {tokenizer.max_token_bytes} bytes: at most {most} characters)")


async def chat_prompt(body: ChatRequest, tokenizer: Tokenizer, context: int) -> list[int]:
    messages = [m.as_template_input() for m in body.messages]
    check_text_size(sum(len(m["content"]) for m in messages), tokenizer, context, "messages")
    try:
        return await asyncio.to_thread(tokenizer.encode_chat, messages)
    except EngineError as exc:
        raise bad_request("messages", str(exc)) from None


async def completion_prompts(body: CompletionRequest, tokenizer: Tokenizer, context: int) -> list[list[int]]:
    """The ids of each prompt: a string or token ids, or a list of up to MAX_PROMPTS of either (OpenAI's and
    vLLM's batch form: one choice per prompt)."""
    batch = body.prompt
    if not (isinstance(batch, list) and batch and isinstance(batch[0], (str, list))):
        return [await _prompt_ids(batch, tokenizer, context, "prompt")]  # type: ignore[arg-type]
    if len(batch) > MAX_PROMPTS:
        raise bad_request("prompt", f"a list of {len(batch)} prompts; at most {MAX_PROMPTS} in one request")
    check_text_size(sum(len(p) for p in batch if isinstance(p, str)), tokenizer, context * len(batch), "prompt")
    items = cast("list[str | list[int]]", batch)
    return [await _prompt_ids(p, tokenizer, context, f"prompt.{i}") for i, p in enumerate(items)]


async def _prompt_ids(prompt: str | list[int], tokenizer: Tokenizer, context: int, field: str) -> list[int]:
    if isinstance(prompt, str):
        check_text_size(len(prompt), tokenizer, context, field)
        try:
            ids = await asyncio.to_thread(tokenizer.encode, prompt)
        except EngineError as exc:
            raise bad_request(field, str(exc)) from None
    else:
        ids, vocab = prompt, tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(field, f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
    if not ids:
        raise bad_request(field, "empty prompt")
    return ids
