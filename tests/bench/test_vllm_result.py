"""vLLM's result JSON from requests whose timings are known: goodput counted as vLLM's `calculate_metrics`
counts it, the statistics, the peaks (vLLM 0.33's: per second), and the file name."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pdtop.bench.loadgen import LoadSpec, summarize
from pdtop.bench.openai_request import RequestResult
from pdtop.bench.vllm_result import result_filename, result_json, result_table


def request(start: float, ttft: float, itls: list[float], ok: bool = True) -> RequestResult:
    return RequestResult(ok=ok, prompt_tokens=10, output_tokens=len(itls) + 1 if ok else 0, ttft=ttft,
                         latency=ttft + sum(itls), itls=itls, start_time=start, error="" if ok else "boom")


RESULTS = [
    request(100.0, 0.100, [0.020, 0.020, 0.020]),  # TPOT 20 ms, E2EL 160 ms
    request(100.0, 0.300, [0.050]),  # TPOT 50 ms, E2EL 350 ms
    request(100.1, 0.050, []),  # one token: TPOT 0, which vLLM counts as meeting a TPOT SLO
    request(101.0, 0.0, [], ok=False),
]


def test_goodput_counts_requests_meeting_every_slo_as_vllm_does():
    cases = [({"ttft": 100}, 2),  # a TTFT equal to its SLO meets it
             ({"tpot": 20}, 2),  # 20 ms and the one-token request's 0
             ({"ttft": 300, "tpot": 20}, 2), ({"e2el": 350}, 3), ({"ttft": 10}, 0)]
    for slos, good in cases:
        spec = LoadSpec(url="http://x/v1", model="m", num_prompts=4, goodput=slos)
        r = result_json(spec, RESULTS, 2.0, date="20260101-000000", tokenizer_id="t")
        assert r["request_goodput"] == good / 2.0, slos
        assert summarize(spec, RESULTS, 2.0)["goodput"] == r["request_goodput"]  # pdtop's --json agrees
    r = result_json(LoadSpec(url="http://x/v1", model="m"), RESULTS, 2.0, date="d", tokenizer_id="t")
    assert r["request_goodput"] is None


def test_statistics_totals_and_peaks():
    spec = LoadSpec(url="http://x/v1", model="org/Model-1B", num_prompts=4, max_concurrency=3)
    r = result_json(spec, RESULTS, 2.0, date="20260101-000000", tokenizer_id="t", detailed=True,
                    metrics=("ttft", "tpot", "itl", "e2el"), percentiles=(50.0, 99.9))
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (3, 1, 30, 7)
    assert r["output_lens"] == [4, 2, 1, 0] and r["errors"] == ["", "", "", "boom"]
    assert r["mean_ttft_ms"] == pytest.approx(150.0) and r["median_ttft_ms"] == pytest.approx(100.0)
    assert r["p50_tpot_ms"] == pytest.approx(35.0)  # the two requests with more than one token
    assert r["median_itl_ms"] == pytest.approx(20.0) and r["p99.9_itl_ms"] == pytest.approx(49.91)
    assert r["std_e2el_ms"] == pytest.approx(1e3 * float(np.std([0.16, 0.35, 0.05])))
    assert r["max_concurrent_requests"] == 3 and r["max_output_tokens_per_s"] == 7
    assert result_filename(spec, None, "20260101-000000", None, "out") == \
        "out/openai-infqps-concurrency3-Model-1B-20260101-000000.json"
    table = result_table(r, ("ttft", "e2el"), (50.0, 99.9))
    assert f"{'Successful requests:':<40} {3:<10}" in table and "P99.9 E2EL (ms):" in table
    assert "TPOT" not in table and "Maximum request concurrency:" in table


def test_no_completed_request_gives_zeros_as_vllm():
    spec = LoadSpec(url="http://x/v1", model="m", num_prompts=1, request_rate=2.0)
    r = result_json(spec, [request(0.0, 0.0, [], ok=False)], 1.0, date="d", tokenizer_id="t")
    assert r["mean_ttft_ms"] == r["p99_itl_ms"] == 0.0 and r["max_concurrent_requests"] == 0
    assert r["request_rate"] == 2.0 and not math.isnan(r["std_tpot_ms"])
    assert "ttfts" not in r and r["latencies"] == [0.0]  # the arrays only with detailed, as --save-detailed


def test_peak_concurrency_counts_the_requests_active_in_one_second_as_vllm_033():
    """Two requests one after the other within the same second: vLLM 0.33 counts both in that second."""
    spec = LoadSpec(url="http://x", model="m", num_prompts=2)
    r = result_json(spec, [request(10.0, 0.1, [0.1]), request(10.5, 0.1, [0.1])], 1.0, date="d", tokenizer_id="t")
    assert r["max_concurrent_requests"] == 2 and r["max_output_tokens_per_s"] == 4 and r["rtfx"] == 0.0
    ramp = LoadSpec(url="http://x", model="org/m", model_id="org/m-root", ramp_up=("exponential", 2, 8))
    assert result_filename(ramp, "run", "d", None, None) == "run-ramp-up-exponential-2qps-8qps-m-root-d.json"
