"""`pdtop bench --url` with a ShareGPT file and a JSONL file against the real pdtop API (the real model), and
the result JSON vLLM's `--save-result` writes, field by field."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

# The fields issue 29 lists, by vLLM's names (`vllm/benchmarks/serve.py`).
TOTALS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
          "request_goodput", "output_throughput", "total_token_throughput")
ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
STATS = tuple(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99"))

HUMAN = ["Name a color.", "Write a short poem about rain on a tin roof.",
         "What are three good reasons to learn a second language, and which language would you pick first?"]
GPT = ["Blue is a color.", "Rain taps the roof all night long, soft and steady.", "Travel, work, and a sharp mind."]


def bench(live, tmp_path, *args: str, url: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--url", url or live.url, "--ignore-eos",
                          "--save-result", "--result-dir", str(tmp_path / "results"), "--result-filename", "r.json",
                          *args],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "Serving Benchmark Result" in out.stdout and out.stderr == ""
    return json.loads((tmp_path / "results" / "r.json").read_text())


def test_sharegpt_file_through_bench_url_and_the_saved_fields(live, tokenizer, tmp_path):
    entries = [{"id": str(i), "conversations": [{"from": "human", "value": h}, {"from": "gpt", "value": g}]}
               for i, (h, g) in enumerate(zip(HUMAN, GPT, strict=True))]
    entries += [{"id": "one turn", "conversations": [{"from": "human", "value": HUMAN[0]}]},  # dropped, as vLLM
                {"id": "short answer", "conversations": [{"from": "human", "value": HUMAN[1]},
                                                         {"from": "gpt", "value": "Yes."}]}]  # under 4 tokens
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    n = len(live.finishes())
    r = bench(live, tmp_path, "--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "5",
              "--save-detailed", "--percentile-metrics", "ttft,tpot,itl,e2el", "--goodput", "e2el:600000")
    assert set(TOTALS + ARRAYS + STATS) <= set(r)
    live.wait(lambda: len(live.finishes()) >= n + 6)
    engine = live.finishes()[n:]
    assert len(engine) == 6 and r["completed"] == 5 and r["failed"] == 0  # 5 counted and the warm-up
    # the human turn went as text (the server's tokenizer counted it), the gpt turn's length became max_tokens
    lengths = {len(tokenizer.encode(h)): len(tokenizer.encode(g)) for h, g in zip(HUMAN, GPT, strict=True)}
    assert all(lengths[i] == o for i, o in zip(r["input_lens"], r["output_lens"], strict=True))
    assert len(set(r["input_lens"])) == 3  # oversampled from the three usable conversations
    assert sorted(r["input_lens"]) == sorted(e.prompt_tokens for e in engine[1:])
    assert r["total_input_tokens"] == sum(r["input_lens"]) and r["total_output_tokens"] == sum(r["output_lens"])
    assert r["request_throughput"] == r["completed"] / r["duration"] and r["request_goodput"] > 0
    assert r["errors"] == [""] * 5 and all(t.strip() for t in r["generated_texts"])
    itls = [g for row in r["itls"] for g in row]
    assert len(itls) == sum(o - 1 for o in r["output_lens"])
    assert r["median_ttft_ms"] == 1e3 * float(np.median(r["ttfts"]))
    assert r["p99_itl_ms"] == 1e3 * float(np.percentile(itls, 99))
    assert r["std_e2el_ms"] == 1e3 * float(np.std(r["latencies"]))
    # vLLM 0.33 writes the listed model's root as model_id: the GGUF file the server loaded
    assert r["backend"] == "openai" and r["model_id"] == live.engine.model_path and r["burstiness"] == 1.0


def test_jsonl_file_through_bench_url_with_the_chat_template_and_default_fields(live, tokenizer, tmp_path):
    rows = [{"prompt": p, "output_len": k} for p, k in zip(HUMAN, (3, 4, 5), strict=True)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    n = len(live.finishes())
    r = bench(live, tmp_path, "--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", "3",
              "--metric-percentiles", "50,99.9")
    live.wait(lambda: len(live.finishes()) >= n + 4)
    engine = live.finishes()[n + 1:]  # after the warm-up
    chat = {len(tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]))): k
            for p, k in zip(HUMAN, (3, 4, 5), strict=True)}
    assert sorted((e.prompt_tokens, e.output_tokens) for e in engine) == sorted(chat.items())
    assert r["completed"] == 3 and r["total_output_tokens"] == 12
    assert r["total_input_tokens"] == sum(chat)
    # vLLM's defaults: no per-request arrays without --save-detailed; ttft, tpot and itl only
    assert not set(ARRAYS) & set(r) and len(r["latencies"]) == 3
    assert {"p50_ttft_ms", "p99.9_itl_ms", "mean_tpot_ms"} <= set(r) and "mean_e2el_ms" not in r
    assert r["request_goodput"] is None


def test_vllm_033s_chat_backend_at_a_bare_address_against_the_real_api(live, tokenizer, tmp_path):
    """`vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --base-url http://HOST:PORT`:
    the prompt goes as a user message's text part, the server's chat template wraps it, usage counts it."""
    n = len(live.finishes())
    r = bench(live, tmp_path, "--num-prompts", "2", "--random-input-len", "12", "--random-output-len", "3",
              "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--save-detailed",
              "--max-concurrency", "1", "--percentile-metrics", "ttft,client_queue_time",
              url=live.url.removesuffix("/v1"))
    live.wait(lambda: len(live.finishes()) >= n + 3)
    engine = live.finishes()[n + 1:]  # after the warm-up
    assert r["backend"] == "openai-chat" and r["completed"] == 2 and r["output_lens"] == [3, 3]
    assert sorted(r["input_lens"]) == sorted(e.prompt_tokens for e in engine)
    assert min(r["input_lens"]) > 12  # the chat template's tokens around the 12-token prompt
    assert "mean_client_queue_time_ms" in r and r["rtfx"] == 0.0
