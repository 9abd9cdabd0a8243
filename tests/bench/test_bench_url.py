"""`pdtop bench --url` as a `vllm bench serve` user runs it, against a real loopback server (`StubServer`):
the uncounted warm-up, vLLM's arrivals, bad options, and what Ctrl+C (a real SIGINT) leaves printed
and saved."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from sigint import interrupt

from pdtop.bench.loadgen import arrival_offsets
from pdtop.cli import main

PDTOP = [sys.executable, "-m", "pdtop"]


def bench_url(url: str, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [*PDTOP, "bench", "--url", url, "--random-input-len", "8", "--random-output-len", "4",
           "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "r.json", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    path = tmp_path / "r.json"
    return out, (json.loads(path.read_text()) if path.exists() else {})


def test_the_warm_up_request_goes_first_and_is_not_counted(stub, tmp_path):
    server = stub(first_ttft_s=1.5)  # a cold server: its first request is slow
    out, result = bench_url(server.url, tmp_path, "--num-prompts", "3", "--max-concurrency", "1")
    assert out.returncode == 0, out.stderr
    assert server.started == 4 and result["completed"] == 3 and result["failed"] == 0
    assert result["generated_texts"] == [" warm" * 4] * 3  # the cold request is not among them
    assert max(result["ttfts"]) < 1.5 and result["p99_ttft_ms"] < 1500


def test_no_warmup_counts_the_cold_first_request(stub, tmp_path):
    server = stub(first_ttft_s=1.5)
    out, result = bench_url(server.url, tmp_path, "--num-prompts", "3", "--max-concurrency", "1", "--no-warmup")
    assert out.returncode == 0, out.stderr
    assert server.started == 3 and result["completed"] == 3
    assert result["generated_texts"][0] == " cold" * 4
    assert result["ttfts"][0] >= 1.5 and result["p99_ttft_ms"] >= 1e3 * max(result["ttfts"][1:])


def test_a_failed_warm_up_is_one_line_and_nothing_is_saved(stub, tmp_path):
    server = stub(status=500)
    out, result = bench_url(server.url, tmp_path, "--num-prompts", "3")
    assert out.returncode == 2 and out.stdout == "" and result == {}
    assert out.stderr.count("\n") == 1 and "warm-up request" in out.stderr and "HTTP 500" in out.stderr
    assert server.started == 1


def test_arrivals_are_vllms_gamma_gaps_scaled_to_end_at_n_over_rate():
    n, rate = 200, 8.0
    for burstiness in (0.5, 1.0, 3.0):
        got = arrival_offsets(n, rate, burstiness, seed=7)
        # vllm bench serve's get_request: np.random.seed(seed), one gamma draw a request, summed, rescaled
        np.random.seed(7)
        gaps = [np.random.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)) for _ in range(n)]
        want = np.cumsum(gaps) * (n / rate / np.sum(gaps))
        assert np.allclose(got, want, rtol=1e-12) and got[-1] == pytest.approx(n / rate, rel=1e-12)
    assert arrival_offsets(4, math.inf, 0.5) == [0.0] * 4
    assert arrival_offsets(4, 2.0, math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_burstiness_shapes_the_gaps():
    """Gamma gaps of shape k have a coefficient of variation 1 / sqrt(k): lower burstiness, burstier."""
    for k in (0.25, 1.0, 4.0):
        gaps = np.diff([0.0, *arrival_offsets(20000, 10.0, k, seed=1)])
        assert np.std(gaps) / np.mean(gaps) == pytest.approx(1 / math.sqrt(k), rel=0.08)


def test_the_rate_and_burstiness_reach_the_run_and_its_result(stub, tmp_path):
    server = stub()
    out, result = bench_url(server.url, tmp_path, "--num-prompts", "5", "--request-rate", "10",
                            "--burstiness", "inf")
    assert out.returncode == 0, out.stderr
    assert result["request_rate"] == 10.0 and result["burstiness"] == math.inf
    assert result["duration"] >= 0.5  # sent 0.1, 0.2, ... 0.5 s after the start, not all at once
    assert all(b - a > 0.05 for a, b in zip(result["start_times"], result["start_times"][1:], strict=False))
    assert "Request rate configured (RPS):" in out.stdout and "Burstiness" not in out.stderr


@pytest.mark.parametrize("args,message", [
    (["--burstiness", "0"], "--burstiness must be > 0"),
    (["--dataset-path", "x.json"], "--dataset-path needs --dataset-name sharegpt or custom"),
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path FILE"),
    (["--percentile-metrics", "ttft,p99"], "--percentile-metrics takes names from ttft,tpot,itl,e2el"),
    (["--metric-percentiles", "50,x"], "--metric-percentiles takes numbers in (0, 100]"),
    (["--sharegpt-output-len", "0"], "--sharegpt-output-len must be >= 1"),
    (["--goodput", "ttft:-1"], "--goodput 'ttft:-1': the value must be a number of milliseconds >= 0"),
])
def test_bad_options_are_one_line_and_exit_2(args, message, capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9/v1", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_dataset_files_are_one_line_naming_the_file(tmp_path, capsys):
    bad_json, no_prompt, empty = tmp_path / "bad.json", tmp_path / "rows.jsonl", tmp_path / "none.json"
    bad_json.write_text("[{")
    no_prompt.write_text('{"prompt": "fine"}\n{"text": "no prompt"}\n')
    empty.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}]))
    for name, path, message in (("sharegpt", bad_json, "not JSON"), ("custom", no_prompt, "rows.jsonl:2"),
                                ("sharegpt", empty, "no conversation"), ("custom", tmp_path / "gone", "gone")):
        assert main(["bench", "--url", "http://127.0.0.1:9/v1", "--dataset-name", name,
                     "--dataset-path", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and str(path.name) in err


def test_ctrl_c_in_bench_url_keeps_and_prints_what_was_measured(stub, tmp_path):
    server = stub(gap_s=0.05, tokens=6)  # each request takes about 0.25 s
    path = tmp_path / "r.json"
    rc, out, err = interrupt([*PDTOP, "bench", "--url", server.url, "--num-prompts", "50", "--max-concurrency", "1",
                              "--random-input-len", "8", "--save-result", "--result-dir", str(tmp_path),
                              "--result-filename", "r.json"], lambda _: server.finished >= 4)
    assert rc == 130
    done = json.loads(path.read_text())["completed"]
    assert 2 <= done <= server.finished - 1  # the warm-up is not counted; the request cut short is not either
    assert f"{'Successful requests:':<40} {done:<10}" in out and "Mean TTFT (ms):" in out
    assert err.count("\n") == 1 and f"interrupted: {done} of 50 requests finished" in err


def test_ctrl_c_during_the_warm_up_is_one_line_and_nothing_else(stub):
    server = stub(first_ttft_s=30.0)
    rc, out, err = interrupt([*PDTOP, "bench", "--url", server.url, "--num-prompts", "5", "--random-input-len", "8"],
                             lambda _: server.started == 1)
    assert rc == 130 and out == "" and err == "pdtop bench: interrupted during the warm-up request\n"
