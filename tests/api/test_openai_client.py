"""The official `openai` client against pdtop's API (real model, real server on loopback)."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from pdtop.engine.records import RoundRecord
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import generate

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(model_fp32, tokenizer):
    """What `pdtop generate --chat` prints for QUESTION (greedy, up to 24 tokens): the same functions."""
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}]))
    req = Request(0, ids, SamplingParams(max_tokens=24))
    tokens = list(generate(ModelRunner(model_fp32, 1024), req))
    text_ids = tokens[:-1] if req.finish_reason == "eos" else tokens
    return {"text": tokenizer.decode(text_ids), "prompt_tokens": len(ids), "completion_tokens": len(tokens),
            "finish_reason": "stop" if req.finish_reason == "eos" else "length"}


def test_models_lists_the_served_model(client, live):
    assert [m.id for m in client.models.list().data] == [live.engine.model_name]


def test_greedy_chat_equals_pdtop_generate_whole_and_streamed(client, live, expected):
    assert expected["text"].startswith("The capital of France is Paris.")
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model=live.engine.model_name, messages=messages, temperature=0,
                                           max_tokens=24)
    assert whole.choices[0].message.content == expected["text"]
    assert whole.choices[0].finish_reason == expected["finish_reason"]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (expected["prompt_tokens"],
                                                                         expected["completion_tokens"])
    chunks = list(client.chat.completions.create(model=live.engine.model_name, messages=messages, temperature=0,
                                                 max_tokens=24, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [expected["finish_reason"]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected["completion_tokens"]
    # the engine saw them as API requests, with the same token counts
    api = live.finishes()
    assert [r.output_tokens for r in api[-2:]] == [expected["completion_tokens"]] * 2


def test_completions_whole_and_streamed_agree(client, live):
    args = {"model": live.engine.model_name, "prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}
    whole = client.completions.create(**args)
    streamed = list(client.completions.create(**args, stream=True))
    assert whole.choices[0].text and whole.choices[0].text == "".join(c.choices[0].text for c in streamed)
    assert whole.choices[0].finish_reason == streamed[-1].choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12


def test_stop_string_ends_the_request_where_it_matches(client, live, expected):
    before = len(live.finishes())
    out = client.chat.completions.create(model=live.engine.model_name, temperature=0, max_tokens=24, stop=[" Paris"],
                                         messages=[{"role": "user", "content": QUESTION}])
    assert out.choices[0].message.content == "The capital of France is"
    assert out.choices[0].finish_reason == "stop"
    live.wait(lambda: len(live.finishes()) > before)
    finish = live.finishes()[-1]
    assert finish.finish_reason == "stop" and finish.output_tokens == out.usage.completion_tokens


def test_sampling_with_a_seed_repeats(client, live):
    args = {"model": live.engine.model_name, "prompt": "The weather today", "temperature": 0.9, "top_p": 0.9,
            "seed": 7, "max_tokens": 10}
    assert client.completions.create(**args).choices[0].text == client.completions.create(**args).choices[0].text


def test_a_client_that_leaves_mid_stream_aborts_and_frees_kv(live):
    body = {"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    before = len(live.finishes())
    with httpx.Client(timeout=30) as h, h.stream("POST", f"{live.url}/completions", json=body) as r:
        lines, chunks = r.iter_lines(), 0  # kept: leaving a `for` over it would close the connection now
        while chunks < 3:
            chunks += next(lines).startswith("data: ")
        assert live.engine.executor.kv_usage()[0] > 0  # decoding, its KV held; now the client leaves
    live.wait(lambda: len(live.finishes()) > before)
    finish = live.finishes()[-1]
    assert finish.finish_reason == "abort" and finish.output_tokens < 2000
    live.wait_kv_free()


def test_sixteen_concurrent_streams_all_complete(live):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
        stream = await client.completions.create(
            model=live.engine.model_name, prompt=f"Fact number {i}:", max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, reason, tokens = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return text, reason, tokens

    async def main():
        async with openai.AsyncOpenAI(base_url=live.url, api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    n = len(live.records)
    results = asyncio.run(main())
    assert all(reason == "length" and tokens == 8 and text for text, reason, tokens in results)
    rounds = [r for r in live.records[n:] if isinstance(r, RoundRecord)]
    assert max(r.decode_bs for r in rounds) > 1  # they were batched together


def test_special_tokens_stay_out_of_the_text_as_in_vllm(tokenizer):
    """vLLM's `skip_special_tokens` default: control tokens are not written into the text. A simulated GPU
    runs no model, and its placeholder tokens (token 0, a control token here) give no text, only usage."""
    from pdtop.engine.build import build_engine

    from .live_api import LiveApi

    assert 0 in tokenizer.special_ids
    sim = LiveApi(build_engine("sim:H100", workload=None), tokenizer)
    try:
        client = openai.OpenAI(base_url=sim.url, api_key="unused", max_retries=0)
        chat = client.chat.completions.create(model=sim.engine.model_name, max_tokens=5,
                                              messages=[{"role": "user", "content": QUESTION}])
        assert chat.choices[0].message.content == "" and chat.usage.completion_tokens == 5
        streamed = client.completions.create(model=sim.engine.model_name, prompt="Hello", max_tokens=4, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == ""
    finally:
        sim.close()
