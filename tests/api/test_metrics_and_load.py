"""`/metrics` (parsed with prometheus_client's own parser) and the load generator, against the real server."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pdtop.bench.loadgen import LoadSpec, make_prompts, run_load, summarize
from pdtop.engine.scheduling.workload import corpus_text

VLLM_NAMES = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens",
              "generation_tokens", "request_success")
OWN_NAMES = ("split_level", "prefill_units", "decode_units", "decode_bs_divisor", "policy_info")


def _scrape(live) -> dict:
    """(sample name, labels other than model_name) -> value."""
    text = httpx.get(live.root + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.pop("model_name") == live.engine.model_name
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_have_vllms_names_and_move_as_requests_run(live):
    text = httpx.get(live.root + "/metrics", timeout=30).text
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {f"pdtop:{n}" for n in VLLM_NAMES + OWN_NAMES} <= families
    before = _scrape(live)
    body = {"prompt": "Counting: one, two,", "max_tokens": 5, "ignore_eos": True}
    usage = httpx.post(live.url + "/completions", json=body, timeout=60).json()["usage"]
    after = _scrape(live)

    def grew(name: str, **labels: str) -> float:
        key = (f"pdtop:{name}", tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("generation_tokens_total") == 5
    assert grew("prompt_tokens_total") == usage["prompt_tokens"]
    assert grew("request_success_total", finished_reason="length") == 1
    assert grew("time_to_first_token_seconds_count") == grew("e2e_request_latency_seconds_count") == 1
    assert grew("inter_token_latency_seconds_count") == 4
    assert after[("pdtop:decode_bs_divisor", ())] == live.engine.config.decode_bs_divisor
    assert after[("pdtop:policy_info", (("policy", live.engine.scheduler.policy),))] == 1
    assert after[("pdtop:num_requests_running", ())] == 0


def test_running_requests_and_kv_usage_show_while_a_stream_runs(live):
    body = {"prompt": "A long story:", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", live.url + "/completions", json=body, timeout=60) as r:
        # the iterator is kept: leaving a `for` over it closes it, and with it the connection, so the
        # server would abort the request while the scrape runs (the test flaked so, 1 run in 3)
        lines, chunks = r.iter_lines(), 0
        while chunks < 3:
            chunks += next(lines).startswith("data: ")
        now = _scrape(live)
    assert now[("pdtop:num_requests_running", ())] == 1
    assert now[("pdtop:kv_cache_usage_perc", ())] > 0
    assert now[("pdtop:decode_units", ())] >= 1
    live.wait_kv_free()


def test_load_generator_figures_agree_with_the_engine_records(live, tokenizer):
    spec = LoadSpec(url=live.url, num_prompts=6, input_len=32, output_len=8, max_concurrency=3, ignore_eos=True)
    prompts = make_prompts(spec, tokenizer.encode(corpus_text()), tokenizer.decode)
    n = len(live.finishes())
    results, duration = asyncio.run(run_load(spec, prompts))
    summary = summarize(spec, results, duration)
    engine = live.finishes()[n:]
    assert summary["completed"] == len(engine) == 6 and summary["failed"] == 0
    assert summary["total_output_tokens"] == sum(r.output_tokens for r in engine) == 48
    assert summary["total_input_tokens"] == sum(r.prompt_tokens for r in engine)
    assert sum(len(r.itls) for r in results) == sum(len(r.itls_s) for r in engine) == 6 * 7
    # the client's clock starts before the engine sees a request and stops after its last token
    assert summary["ttft_ms"]["mean"] >= 1e3 * sum(r.ttft_s for r in engine) / 6
    assert summary["e2el_ms"]["mean"] >= 1e3 * sum(r.ttft_s + sum(r.itls_s) for r in engine) / 6
    assert summary["scenario"]["model"] == live.engine.model_name


def test_bench_url_command_prints_one_json_object_with_the_scenario(live):
    out = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--url", live.url, "--num-prompts", "2",
                          "--random-input-len", "16", "--random-output-len", "3", "--ignore-eos", "--json",
                          "--goodput", "ttft:60000", "tpot:60000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["completed"] == 2 and result["total_output_tokens"] == 6 and result["goodput"] > 0
    assert result["scenario"]["num_prompts"] == 2 and result["scenario"]["request_rate"] == "inf"
    bad = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--url", live.url, "--goodput", "ttft"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--goodput" in bad.stderr
