"""Bad input and overload, in OpenAI's error shape; none of it disturbs the engine or other requests."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from pdtop.api.schemas import VLLM_FIELDS
from pdtop.engine.build import build_engine
from pdtop.engine.scheduling.admission import QueueLimits

from .live_api import LiveApi


def _post(url: str, body, path: str = "/completions", **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return httpx.post(url + path, content=content, headers=headers, timeout=30, **kw)


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
CASES = [  # (path, body, the field the error names)
    ("/completions", {"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ("/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/completions", {"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ("/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
    ("/completions", {"prompt": ["a"] * 65}, "prompt"),
    ("/completions", {"prompt": ["a", 5]}, "prompt"),
    ("/completions", {"prompt": ["a", ""]}, "prompt.1"),
    ("/completions", {"prompt": [1, 2, 10**9]}, "prompt"),
    ("/completions", {"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ("/completions", {"prompt": "hi", "max_tokens": 10**9}, "max_tokens"),
    ("/completions", {"prompt": [7] * 8192}, "prompt"),
    ("/completions", {"prompt": "hi", "n": 2}, "n"),
    ("/completions", {"prompt": "hi", "logprobs": 3}, "logprobs"),
    ("/completions", {"prompt": "hi", "stop": [""]}, "stop"),
    ("/completions", {"prompt": "hi", "logprobs": 1}, "logprobs"),
    ("/completions", {"prompt": "hi", "top_k": -2}, "top_k"),
    ("/completions", {"prompt": "hi", "top_k": 1.5}, "top_k"),
    ("/completions", {"prompt": "hi", "min_p": 1.5}, "min_p"),
    ("/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ("/completions", {"prompt": "hi", "min_tokens": -1}, "min_tokens"),
    ("/completions", {"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ("/completions", {"prompt": "hi", "stop_token_ids": [10**9]}, "stop_token_ids"),
    ("/completions", {"prompt": "hi", "stop_token_ids": ["a"]}, "stop_token_ids.0"),
    ("/completions", {"prompt": "hi", "stop_token_ids": [1] * 1025}, "stop_token_ids"),
    ("/chat/completions", {**CHAT, "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ("/chat/completions", {**CHAT, "logprobs": True}, "logprobs"),
    ("/chat/completions", {"messages": "Hi"}, "messages"),
    ("/chat/completions", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
    ("/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("/chat/completions", {**CHAT, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize(("path", "body", "field"), CASES, ids=[f"{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_bad_fields_are_400_naming_the_field(live, path, body, field):
    r = _post(live.url, body, path)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == field and err["message"].startswith(field + ":") and err["type"] == "invalid_request_error"
    if field.split(".")[0] in VLLM_FIELDS:  # vLLM's extensions: the rule is vLLM 0.33's, and the error says so
        assert "vLLM 0.33" in err["message"], err["message"]


def test_malformed_json_wrong_content_type_and_unknown_model(live):
    r = _post(live.url, b'{"prompt": "hi",')
    assert r.status_code == 400 and _error(r)["message"].startswith("malformed JSON")
    r = _post(live.url, b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "Content-Type" in _error(r)["message"]
    r = _post(live.url, {"prompt": "hi", "model": "gpt-4"})
    assert r.status_code == 404 and _error(r)["code"] == "model_not_found" and _error(r)["param"] == "model"
    r = httpx.get(live.root + "/v2/nothing", timeout=30)
    assert r.status_code == 404 and _error(r)["message"] == "Not Found"


def test_the_engine_goes_on_serving_after_bad_input(live):
    before = len(live.finishes())
    for path, body, _ in CASES:
        _post(live.url, body, path)
    r = _post(live.url, {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert len(live.finishes()) == before + 1  # bad requests never reached the scheduler


@pytest.fixture(scope="module")
def stalled(tokenizer):
    """A simulated GPU whose engine never runs, with room for two waiting requests, behind a token."""
    server = LiveApi(build_engine("sim:H100", limits=QueueLimits(max_waiting_requests=2)), tokenizer,
                     run_engine=False, token="s3cret")
    yield server
    server.close()


def test_a_full_waiting_queue_is_503_with_retry_after(stalled):
    auth = {"authorization": "Bearer s3cret"}
    body = {"prompt": "hi", "max_tokens": 4, "stream": True}
    opened = []

    def hold() -> None:  # a streaming request that waits in the queue (the engine never runs)
        try:
            with httpx.stream("POST", stalled.url + "/completions", json=body, headers=auth, timeout=30) as r:
                opened.append(r.status_code)
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass  # the server closed it at the end of the module

    holders = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
    for t in holders:
        t.start()
    while len(opened) < 2:
        threading.Event().wait(0.01)
    r = _post(stalled.url, body, headers=auth)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    err = _error(r)
    assert err["code"] == "queue_full" and "max_waiting_requests 2" in err["message"]
    assert stalled.engine.describe().limits.refused["api"] == 1


def test_the_token_guards_v1_but_not_health_or_metrics(stalled):
    assert httpx.get(stalled.url + "/models", timeout=30).status_code == 401
    r = httpx.get(stalled.url + "/models", headers={"authorization": "Bearer wrong"}, timeout=30)
    assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key"
    r = httpx.get(stalled.url + "/models", headers={"authorization": "Bearer s3cret"}, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "synthetic:qwen3-8b"
    assert httpx.get(stalled.root + "/health", timeout=30).status_code == 200
    assert httpx.get(stalled.root + "/metrics", timeout=30).status_code == 200
