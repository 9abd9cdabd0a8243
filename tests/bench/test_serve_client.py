"""`pdtop bench --url` with `vllm bench serve` 0.33's options, against a real loopback server (`StubServer`,
which keeps what each request carried): where requests go, what they carry, the uncounted requests, the
result file's new keys, and the options refused in one line."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from pdtop.bench.loadgen import arrival_offsets
from pdtop.cli import main


def bench(capsys, tmp_path, *args: str, detailed: bool = True) -> tuple[int, str, str, dict]:
    """`pdtop bench` with a small random load, saving its result to tmp_path/r.json."""
    rc = main(["bench", "--random-input-len", "8", "--random-output-len", "4", "--num-prompts", "2",
               "--save-result", *(["--save-detailed"] if detailed else []), "--result-dir", str(tmp_path),
               "--result-filename", "r.json", *args])
    out, err = capsys.readouterr()
    path = tmp_path / "r.json"
    result = json.loads(path.read_text()) if path.exists() and path.read_text() else {}
    return rc, out, err, result


def test_a_bare_url_base_url_and_host_port_all_reach_v1_completions(stub, tmp_path, capsys):
    server = stub()
    base = f"http://127.0.0.1:{server.port}"
    for address in (["--url", base], ["--url", base + "/v1/"], ["--base-url", base],
                    ["--host", "127.0.0.1", "--port", str(server.port)]):
        rc, _, err, result = bench(capsys, tmp_path, *address)
        assert rc == 0, err
        # vLLM 0.33: requests carry the listed id, the result names the model by its root
        assert result["model_id"] == "org/stub-root" and result["completed"] == 2
    assert {path for path, _, _ in server.requests} == {"/v1/completions"}
    assert {body["model"] for _, _, body in server.requests} == {"stub"}


def test_the_default_file_name_is_vllms_with_the_backend_as_label(stub, tmp_path, capsys):
    server = stub()
    assert main(["bench", "--url", server.url, "--num-prompts", "1", "--random-input-len", "8", "--save-result",
                 "--result-dir", str(tmp_path), "--max-concurrency", "2", "--backend", "vllm"]) == 0
    names = os.listdir(tmp_path)
    assert len(names) == 1 and names[0].startswith("vllm-infqps-concurrency2-stub-root-"), names
    result = json.loads((tmp_path / names[0]).read_text())
    assert result["backend"] == result["endpoint_type"] == "vllm" and result["label"] is None


def test_openai_chat_sends_messages_and_times_the_first_content_not_the_role(stub, tmp_path, capsys):
    server = stub(gap_s=0.05)
    rc, _, err, result = bench(capsys, tmp_path, "--url", server.url, "--backend", "openai-chat",
                               "--endpoint", "/v1/chat/completions", "--no-warmup")
    assert rc == 0, err
    path, _, body = server.requests[0]
    assert path == "/v1/chat/completions" and "max_tokens" not in body and body["max_completion_tokens"] == 4
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": body["messages"][0][
        "content"][0]["text"]}]}] and body["stream_options"] == {"include_usage": True}
    # both requests go at once: which the stub saw first ("cold") is the network's choice
    assert sorted(result["generated_texts"]) == [" cold" * 4, " warm" * 4] and result["output_lens"] == [4, 4]
    assert all(len(row) == 3 for row in result["itls"])  # the role chunk is neither the first token nor a gap
    assert min(result["itls"][0]) >= 0.04
    assert main(["bench", "--url", server.url, "--backend", "openai-chat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ending in chat/completions (vLLM 0.33's rule)" in err


def test_headers_sampling_and_the_api_key_reach_every_request(stub, tmp_path, capsys, monkeypatch):
    server = stub()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    rc, _, err, _ = bench(capsys, tmp_path, "--url", server.url, "--header", "x-run=7", "--temperature", "0.7",
                          "--top-p", "0.9", "--top-k", "5", "--min-p", "0.1")
    assert rc == 0, err
    for _, headers, body in server.requests:
        assert headers["x-run"] == "7" and headers["Authorization"] == "Bearer sk-env"
        assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0.7, 0.9, 5, 0.1)
    server.requests.clear()
    rc, _, err, _ = bench(capsys, tmp_path, "--url", server.url, "--header", "Authorization=Bearer sk-flag")
    assert rc == 0, err  # --header overrides the key, as vLLM's extra headers do; greedy unless asked
    assert {(h["Authorization"], b["temperature"], "top_k" in b) for _, h, b in server.requests} == {
        ("Bearer sk-flag", 0.0, False)}


def test_num_warmups_and_the_ready_check_are_uncounted_requests(stub, tmp_path, capsys):
    server = stub()
    rc, _, err, result = bench(capsys, tmp_path, "--url", server.url, "--num-warmups", "3")
    assert rc == 0, err
    assert server.started == 1 + 3 + 2 and result["completed"] == 2  # pdtop's warm-up, vLLM's 3, the load
    server = stub()
    rc, _, err, result = bench(capsys, tmp_path, "--url", server.url, "--ready-check-timeout-sec", "0")
    assert rc == 0 and server.started == 2  # vLLM's 0: no test request at all
    server = stub(status=500)
    rc, out, err, result = bench(capsys, tmp_path, "--url", server.url, "--ready-check-timeout-sec", "1")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "not ready within 1 s: HTTP 500" in err and server.started == 2  # tried, waited, tried again


def test_append_result_adds_a_line_and_metadata_goes_after_the_setup(stub, tmp_path, capsys):
    server = stub()
    for _ in range(2):
        assert main(["bench", "--url", server.url, "--num-prompts", "1", "--random-input-len", "8",
                     "--append-result", "--result-dir", str(tmp_path), "--result-filename", "r.jsonl",
                     "--metadata", "version=0.33", "tp = 1", "request_rate=overridden"]) == 0
    lines = (tmp_path / "r.jsonl").read_text().split("\n")
    assert len(lines) == 2
    for line in lines:
        r = json.loads(line)
        keys = list(r)
        assert keys[:10] == ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                             "version", "tp", "request_rate"]
        assert r["version"] == "0.33" and r["tp"] == "1" and r["request_rate"] == "inf"  # vLLM's order of writes
        assert keys.index("rtfx") == keys.index("max_concurrent_requests") + 1 and r["rtfx"] == 0.0
        assert "ttfts" not in r  # no --save-detailed


def test_client_queue_statistics_as_vllm_reports_them(stub, tmp_path, capsys):
    server = stub(gap_s=0.02)
    metrics = "ttft,client_queue_time,e2el_including_client_queue"
    rc, out, err, r = bench(capsys, tmp_path, "--url", server.url, "--num-prompts", "4", "--max-concurrency", "1",
                            "--request-rate", "100", "--percentile-metrics", metrics, "--metric-percentiles", "50")
    assert rc == 0, err
    queued = r["queue_times"]
    assert max(queued) > 0.02  # with one slot, requests sent 10 ms apart wait for the one before
    assert r["mean_client_queue_time_ms"] == pytest.approx(1e3 * float(np.mean(queued)))
    assert r["p50_e2el_including_client_queue_ms"] == pytest.approx(
        1e3 * float(np.median(np.add(r["latencies"], queued))))
    assert "Client-side Queueing" in out and "P50 E2EL incl. Client Queue (ms):" in out
    rc, out, err, r = bench(capsys, tmp_path, "--url", server.url, "--percentile-metrics", metrics)
    assert rc == 0 and "mean_ttft_ms" in r and "mean_client_queue_time_ms" not in r  # vLLM: only with a limit
    assert "Client-side Queueing" not in out


def test_ramp_up_arrivals_are_vllms_and_the_result_says_so(stub, tmp_path, capsys):
    n, start, end = 50, 2, 20
    for strategy in ("linear", "exponential"):
        got = arrival_offsets(n, math.inf, 0.5, seed=3, ramp_up=(strategy, start, end))
        # vllm bench serve 0.33's get_request: each request's rate on the ramp, one gamma draw each, not rescaled
        np.random.seed(3)
        rates = [start + (end - start) * i / (n - 1) if strategy == "linear" else start * (end / start) ** (i / (n - 1))
                 for i in range(n)]
        want = np.cumsum([np.random.gamma(shape=0.5, scale=1.0 / (rate * 0.5)) for rate in rates])
        assert np.allclose(got, want, rtol=1e-12)
    server = stub()
    assert main(["bench", "--url", server.url, "--num-prompts", "12", "--random-input-len", "8", "--save-result",
                 "--result-dir", str(tmp_path), "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "20",
                 "--ramp-up-end-rps", "40"]) == 0
    [name] = os.listdir(tmp_path)
    assert name.startswith("openai-ramp-up-linear-20qps-40qps-stub-root-")
    r = json.loads((tmp_path / name).read_text())
    assert (r["ramp_up_strategy"], r["ramp_up_start_rps"], r["ramp_up_end_rps"]) == ("linear", 20, 40)
    assert [e["rps"] for e in r["rps_change_events"]] == list(range(20, 41))
    assert r["request_rate"] == "inf" and "Request rate configured" not in capsys.readouterr().out


def test_a_failed_request_keeps_its_prompt_length(stub, tmp_path, capsys):
    server = stub(status=500)
    rc, _, err, r = bench(capsys, tmp_path, "--url", server.url, "--no-warmup", "--num-prompts", "3")
    assert rc == 1 and "no request completed: HTTP 500" in err
    assert r["input_lens"] == [8, 8, 8] and r["output_lens"] == [0, 0, 0] and r["total_input_tokens"] == 0


def test_a_hugging_face_tokenizer_folder_cuts_and_counts_as_the_gguf(stub, tmp_path, capsys, tokenizer):
    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer._hf.save(str(folder / "tokenizer.json"))  # the file a Hugging Face model folder carries
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tokenizer.chat_template, "eos_token": "<|im_end|>",
        "bos_token": {"content": "<|im_start|>", "special": True}}))
    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in ("Name a color.", "Rain on a tin roof, all night.")))
    server = stub(status=500)  # failed requests keep the local tokenizer's counts
    out = tmp_path / "out"
    for path in (str(folder), str(tokenizer.source)):
        rc, _, err, r = bench(capsys, out, "--url", server.url, "--no-warmup", "--tokenizer", path,
                              "--dataset-name", "custom", "--dataset-path", str(data))
        assert rc == 1 and r["tokenizer_id"] == path, err
        prompts = [b["prompt"] for _, _, b in server.requests[-2:]]  # in the order they arrived, not sent
        assert prompts[0].startswith("<|im_start|>") and prompts[0].endswith("<|im_start|>assistant\n")
        assert sorted(r["input_lens"]) == sorted(len(tokenizer.encode(p)) for p in prompts)
    assert main(["bench", "--url", server.url, "--tokenizer", "meta-llama/Llama-3.1-8B"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pdtop downloads nothing" in err


def test_the_result_path_is_checked_before_the_first_request(stub, tmp_path, capsys):
    server = stub()
    blocker = tmp_path / "file"
    blocker.write_text("")
    (tmp_path / "taken").mkdir()
    for args in (["--result-dir", str(blocker / "sub")], ["--result-dir", str(tmp_path), "--result-filename", "taken"],
                 ["--result-dir", str(blocker)]):  # the default name, checked once the model is known
        rc = main(["bench", "--url", server.url, "--num-prompts", "1", "--save-result", *args])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert server.started == 0
    assert sorted(os.listdir(tmp_path)) == ["file", "taken"]  # the probe left nothing behind


@pytest.mark.parametrize("args,message", [
    (["--url", "U", "--policy", "chunked"], "--policy is the policy comparison's"),
    (["--url", "U", "--device", "cpu"], "--device is the policy comparison's"),
    (["--request-rate", "5"], "--request-rate is the load generator's: name a server with --url"),
    (["--goodput", "ttft:5"], "--goodput is the load generator's"),
    (["--url", "U", "--base-url", "U"], "name the server once"),
    (["--url", "U", "--port", "9"], "name the server once"),
    (["--url", "ftp://x"], "--url must be http://HOST:PORT"),
    (["--port", "0"], "--port must be 1 to 65535"),
    (["--url", "U", "--endpoint", "v1/completions"], "--endpoint is a path starting with /"),
    (["--url", "U", "--goodput", "ttft:-5"], "--goodput 'ttft:-5': the value must be a number of milliseconds"),
    (["--url", "U", "--goodput", "ttfx:5"], "--goodput 'ttfx:5': the metric must be one of ttft, tpot, e2el"),
    (["--url", "U", "--goodput", "ttft"], "--goodput takes METRIC:MS"),
    (["--url", "U", "--header", "novalue"], "--header takes KEY=VALUE"),
    (["--url", "U", "--header", "x=\x1b[2J"], "its value printable ASCII"),
    (["--url", "U", "--metadata", "=x"], "--metadata takes KEY=VALUE"),
    (["--url", "U", "--ramp-up-strategy", "linear"], "needs --ramp-up-start-rps and --ramp-up-end-rps"),
    (["--url", "U", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2",
      "--request-rate", "3"], "leave --request-rate out"),
    (["--url", "U", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "3", "--ramp-up-end-rps", "2"],
     "must not be above --ramp-up-end-rps"),
    (["--url", "U", "--ramp-up-start-rps", "3"], "need --ramp-up-strategy"),
    (["--url", "U", "--num-warmups", "-1"], "--num-warmups must be >= 0"),
    (["--url", "U", "--no-warmup", "--ready-check-timeout-sec", "5"], "the ready check is a warm-up"),
    (["--url", "U", "--temperature", "nan"], "--temperature must be a finite number"),
    (["--url", "U", "--percentile-metrics", "ttft,queue"], "client_queue_time,e2el_including_client_queue"),
    (["--url", "U", "--custom-output-len", "-2", "--dataset-name", "custom", "--dataset-path", "x"],
     "--custom-output-len must be >= 1 (or -1)"),
])
def test_bad_options_are_one_line_naming_what_is_wrong(args, message, capsys):
    args = [a.replace("U", "http://127.0.0.1:9") if a == "U" else a for a in args]
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "\x1b" not in err, err
