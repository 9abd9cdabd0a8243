"""`pdtop bench --device cpu` on the real model, scaled down: interference per batch composition,
the scenario in --json, progress on stderr, and the --trace rows with their slow-step report."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdtop.bench.round_trace import ATTRIBUTES, slow_step_report


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    trace = tmp_path_factory.mktemp("bench") / "trace.jsonl"
    out = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--device", "cpu", "--decode-bs", "2",
                          "--long-tokens", "96", "--long-prompts", "2", "--json", "--trace", str(trace)],
                         capture_output=True, text=True, check=True, timeout=300)
    rows = [strict_json(line) for line in trace.read_text().splitlines()]
    return strict_json(out.stdout), rows, out.stderr


def strict_json(text: str):
    """JSON as strict parsers read it: NaN and Infinity are not JSON."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_json_carries_the_scenario_and_load_average(bench):
    doc, _, _ = bench
    assert doc["device"] == "cpu"
    sc = doc["scenario"]
    assert (sc["decode_bs"], sc["long_tokens"], sc["long_prompts"], sc["decode_prompt"]) == (2, 96, 2, 64)
    assert len(doc["loadavg"]["before"]) == len(doc["loadavg"]["after"]) == 3
    assert doc["machine"]["cpu"] and {"avx2", "avx512f", "amx_tile"} <= set(doc["machine"]["flags"])  # issue 27
    assert set(doc["results"]) == {"pdmux", "chunked", "prefill-first", "disagg"}
    assert {p: r["devices"] for p, r in doc["results"].items()} == {"pdmux": 1, "chunked": 1, "prefill-first": 1,
                                                                   "disagg": 2}


def test_interference_is_each_itl_over_its_own_compositions_baseline(bench):
    doc, rows, _ = bench
    for policy, r in doc["results"].items():
        mine = [row for row in rows if row["policy"] == policy]
        assert len(mine) == r["decode_steps"] > 0
        assert r["ttft_ms"]["n"] == 2
        x = r["interference"]
        assert 0 < x["p50"] <= x["p99"] <= x["max"] and x["n"] > 0
        assert r["itl_ms"]["p50"] > 0  # the raw ITLs stay beside the ratio
        for row in mine:
            # the baseline replays the step's own batch: the same requests at the same contexts
            assert row["decode_bs"] in (2, 3)  # the decode requests, with or without a long prompt
            assert row["baseline_s"] > 0 and row["own_baseline_s"] > 0
            if row["gap_s"] is not None:  # null: a step without a token gap (NaN in memory)
                assert row["ratio"] == pytest.approx(row["gap_s"] / row["baseline_s"])
    # prefill-first decodes on every core: its own cores are the whole device
    assert doc["results"]["prefill-first"]["fewer_cores"]["max"] == pytest.approx(1.0)
    # a long prompt joins the decode batch after its first token, and it is in the baseline's batch too
    assert any(row["decode_bs"] == 3 for row in rows)


def test_progress_goes_to_stderr_per_long_prompt(bench):
    _, _, err = bench
    for policy in ("pdmux", "chunked", "prefill-first"):
        assert f"bench {policy}: long prompt 2/2: TTFT" in err


def test_trace_rows_say_where_the_round_ran_and_the_report_reads_them(bench):
    _, rows, _ = bench
    pd = [row for row in rows if row["policy"] == "pdmux"]
    assert any(row["prefill_attn_ms"] + row["prefill_mlp_ms"] > 0 for row in pd)  # prefill ran beside decode
    for row in pd:
        if row["decode_units"]:  # decode pinned to its own cores (no cores: it runs on all of them)
            assert len(row["decode_cores"]) == row["decode_units"]
        if row["decode_units"] and row["prefill_units"]:  # a split level: the two sides on disjoint cores
            assert not set(row["decode_cores"]) & set(row["prefill_cores"])
    dg = [row for row in rows if row["policy"] == "disagg"]  # two instances on disjoint cores
    assert dg and all(row["decode_units"] > 0 and row["prefill_units"] > 0 for row in dg)
    assert all(not set(row["decode_cores"]) & set(row["prefill_cores"] or ()) for row in dg)
    report = slow_step_report(rows, long_tokens=96)
    assert report.count("decode steps at interference >=") == 4  # one section a policy
    for label, _ in ATTRIBUTES:
        assert label in report


def test_the_default_cpu_scenario_fits_the_default_cpu_kv_cache(model_fp32):
    """`pdtop bench --device cpu` with no flags must run, not stop at its KV check."""
    from pdtop.bench.policy_bench import SCENARIOS
    from pdtop.engine.runtime.kv_sizing import CPU_KV_TOKENS

    sc = SCENARIOS["cpu"]
    budget = min(model_fp32.config.max_context - sc.decode_prompt, sc.decode_tokens)
    assert sc.kv_tokens(budget) <= CPU_KV_TOKENS
