"""vLLM's sampling extensions and a completion's `logprobs: 0` through the API, on the real model, with
vLLM 0.33's meaning: each changes what comes back, none is ignored."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import generate

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _post(live, body: dict, path: str = "/completions") -> dict:
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _text(out: dict) -> str:
    choice = out["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _stream(live, body: dict) -> list[dict]:
    with httpx.stream("POST", live.url + "/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_top_k_1_and_min_p_1_sample_the_greedy_text_whatever_the_seed(live):
    base = {"prompt": "The weather today", "max_tokens": 6, "ignore_eos": True}
    greedy = _text(_post(live, {**base, "temperature": 0}))
    assert len({_text(_post(live, {**base, "temperature": 1.0, "seed": s})) for s in (1, 2, 3)}) > 1  # it does sample
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        assert {_text(_post(live, {**base, **extra, "temperature": 1.0, "seed": s})) for s in (1, 2, 3)} == {greedy}


def test_min_tokens_holds_back_the_end_of_sequence(live):
    short = _post(live, {"messages": QUESTION, "temperature": 0, "max_tokens": 32}, "/chat/completions")
    assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 20
    held = _post(live, {"messages": QUESTION, "temperature": 0, "max_tokens": 32, "min_tokens": 30},
                 "/chat/completions")
    assert held["usage"]["completion_tokens"] >= 30
    assert _text(held).startswith(_text(short))  # the same greedy text, then more where it had ended


def test_stop_token_ids_end_the_request_and_stay_out_of_the_text_unless_asked(live, tokenizer):
    base = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 12, "ignore_eos": True}
    ids = tokenizer.encode(_text(_post(live, base)))
    stop = ids[3]
    first = ids.index(stop)
    out = _post(live, {**base, "stop_token_ids": [stop]})
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == first + 1
    assert _text(out) == tokenizer.decode(ids[:first])  # ignore_eos leaves stop_token_ids on, as in vLLM
    kept = _post(live, {**base, "stop_token_ids": [stop], "include_stop_str_in_output": True})
    assert _text(kept) == tokenizer.decode(ids[:first + 1])


def test_include_stop_str_in_output_keeps_the_stop_string(live):
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 24, "stop": [" Paris"]}
    assert _text(_post(live, body, "/chat/completions")) == "The capital of France is"
    kept = _post(live, {**body, "include_stop_str_in_output": True}, "/chat/completions")
    assert _text(kept) == "The capital of France is Paris" and kept["choices"][0]["finish_reason"] == "stop"
    streamed = _stream(live, {"prompt": "The capital of France is Paris. The capital of Italy is", "temperature": 0,
                              "max_tokens": 12, "stop": [" Rome"], "include_stop_str_in_output": True})
    assert "".join(c["choices"][0]["text"] for c in streamed).endswith(" Rome")


def test_a_stop_string_before_min_tokens_does_not_count(live):
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 24, "stop": ["France"]}
    assert _text(_post(live, body, "/chat/completions")) == "The capital of "
    later = _post(live, {**body, "min_tokens": 5}, "/chat/completions")  # "France" ends within the 5 first tokens
    assert _text(later).startswith("The capital of France is Paris")


def test_repetition_penalty_breaks_a_greedy_loop(live):
    base = {"prompt": "1, 2, 3, 1, 2, 3, 1, 2, 3,", "temperature": 0, "max_tokens": 8, "ignore_eos": True}
    plain, penalized = _text(_post(live, base)), _text(_post(live, {**base, "repetition_penalty": 1.8}))
    assert plain.startswith(" 1, 2, 3") and "1, 2, 3" not in penalized


def test_logprobs_0_give_each_tokens_raw_log_probability(live, model_fp32, tokenizer):
    body = {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 4, "ignore_eos": True,
            "logprobs": 0}
    whole = _post(live, body)["choices"][0]["logprobs"]
    assert set(whole) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(whole["tokens"]) == 4 and all(lp <= 0 for lp in whole["token_logprobs"])
    assert whole["top_logprobs"] == [{t: lp} for t, lp in zip(whole["tokens"], whole["token_logprobs"], strict=True)]
    assert whole["text_offset"] == [sum(map(len, whole["tokens"][:i])) for i in range(4)]
    chunks = [c["choices"][0]["logprobs"] for c in _stream(live, body)]
    streamed = {k: [x for c in chunks if c for x in c[k]] for k in whole}
    assert streamed["tokens"] == whole["tokens"] and streamed["text_offset"] == whole["text_offset"]
    assert streamed["token_logprobs"] == pytest.approx(whole["token_logprobs"], abs=1e-4)
    # the model's own logits, one prefill per position: log-softmax at the token sampled there
    prompt = tokenizer.encode(body["prompt"])
    runner = ModelRunner(model_fp32, 1024)
    out = list(generate(runner, Request(0, prompt, SamplingParams(max_tokens=4, ignore_eos=True))))
    assert [tokenizer.decode([t]) for t in out] == whole["tokens"]
    for k, lp in enumerate(whole["token_logprobs"]):
        req = Request(k, prompt + out[:k], SamplingParams(max_tokens=1))
        runner.admit(req)
        state = runner.prefill_begin([req])
        runner.prefill_layers(state, 0, runner.cfg.num_layers)
        assert state.logits is not None
        assert lp == pytest.approx(float(torch.log_softmax(state.logits[0], -1)[out[k]]), abs=2e-3)
        runner.prefill_finish(state)
        runner.free(req)


def test_models_give_vllms_root(live):
    model = httpx.get(live.url + "/models", timeout=10).json()["data"][0]
    assert model["root"] == live.engine.model_path and model["root"].endswith(".gguf") and model["parent"] is None
