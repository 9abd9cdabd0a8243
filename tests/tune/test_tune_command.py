"""`pdtop tune` end to end on sim:H100, its bad input, and real rounds on this machine's CPU (on CUDA:
tests/tune/test_tune_cuda.py, which the GPU machine can collect)."""
from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdtop.bench.policy_bench import SCENARIOS, check_fits
from pdtop.cli import main
from pdtop.engine.build import build_engine
from pdtop.engine.errors import PromptError
from pdtop.engine.scheduling.pdmux_config import RELEASE_KEYS, SGLANG_KEYS, PdmuxConfig, load_pdmux_config
from pdtop.tune.cli import parse_workload
from pdtop.tune.engine_search import measure, tune
from pdtop.tune.report import best_yaml
from pdtop.tune.score import Slo

ROOT = Path(__file__).resolve().parents[2]
SLO_ITL_MS = 10.25  # between the seed scenario's decode-only ITL (8.9 ms) and SGLang's default (11.6 ms)
SMALL = "decode_bs=8,decode_prompt=512,long_tokens=4096,long_prompts=2"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "best.yaml"
    proc = subprocess.run([sys.executable, "-m", "pdtop", "tune", "--device", "sim:H100", "--slo-itl-ms",
                           str(SLO_ITL_MS), "--out", str(out), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    return proc, out


def test_tuned_config_meets_an_slo_the_default_misses(tuned):
    proc, out = tuned
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["slo"] == {"itl_ms": SLO_ITL_MS, "ttft_ms": None}
    assert data["default"]["config"] == {"sm_group_num": 8, "manual_divisions": [],
                                         "split_forward_token_budget": 65536, "max_split_forward_layers": 0,
                                         "decode_bs_divisor": 36, "overlap_decode_full_sm": False}
    assert not data["default"]["meets_slo"] and data["default"]["itl_p99_ms"] > SLO_ITL_MS
    chosen = data["chosen"]
    assert chosen["meets_slo"] and chosen["itl_p99_ms"] <= SLO_ITL_MS
    assert chosen["goodput_rps"] > data["default"]["goodput_rps"]
    assert data["decode_only_itl_ms"] < SLO_ITL_MS
    search = data["search"]
    assert search["complete"] and search["measured"] < search["grid_points"] / 20
    front = data["front"]
    assert [f["itl_p99_ms"] for f in front] == sorted(f["itl_p99_ms"] for f in front)
    assert all(a["prefill_tok_s"] < b["prefill_tok_s"] for a, b in itertools.pairwise(front))
    assert data["out"] == str(out)


def test_written_yaml_loaded_by_pdtop_meets_the_slo(tuned):
    """The file, loaded as `pdtop --config best.yaml` loads it, runs the scenario within the SLO; the
    default, run the same way, does not."""
    proc, out = tuned
    text = out.read_text()
    assert tuple(yaml.safe_load(text)) == RELEASE_KEYS  # the release's keys only (scheduling/test_pdmux_dump.py)
    assert "# for SGLang 0.5.23: it reads these keys as pdtop measured them" in text
    assert "--chunked-prefill-size -1" in text and "--disable-overlap-schedule" in text  # the release's refusals
    # issue 42 item 17: tune's 9.91 ms and bench --config's 10.3 ms: the header says which the SLO is held against
    assert "over tune's window, which the SLO is held against; pdtop bench --config" in text
    config = load_pdmux_config(str(out))
    assert {k: v for k, v in config.to_dict().items() if k in SGLANG_KEYS} == json.loads(proc.stdout)["chosen"][
        "config"]  # pdtop's own keys (chunk_size, chunked_prefill_size) are not in SGLang's file
    slo = Slo(SLO_ITL_MS / 1e3)
    for cfg, meets in ((config, True), (PdmuxConfig(), False)):
        engine = build_engine("sim:H100", None, cfg)
        try:
            assert slo.met(measure(engine, SCENARIOS["sim"], slo, cfg)) is meets
        finally:
            engine.close()


def test_text_output_has_the_front_plot_and_comparison(capsys):
    assert main(["tune", "--slo-itl-ms", "14", "--workload", SMALL]) == 0
    out = capsys.readouterr().out
    assert "Pareto front (ITL p99 against prefill throughput)" in out
    assert "prefill tok/s" in out and "SLO 14.0 ms │" in out and "└" in out
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("SGLang default"))
    assert lines[row + 1].startswith("chosen") and lines[row + 2].startswith("chosen/default")
    assert "load average" in out


def test_no_configuration_meets_the_slo(capsys, tmp_path):
    out = tmp_path / "never.yaml"
    never = ["tune", "--slo-itl-ms", "100", "--slo-ttft-ms", "1", "--workload", SMALL]
    assert main([*never, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "no configuration meets the SLOs; the closest:" in text
    assert not out.exists()
    assert main([*never, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] is None and data["out"] is None
    assert 1 <= len(data["closest"]) <= 3 and not any(t["meets_slo"] for t in data["closest"])
    # the closest come first by how far they miss: the best TTFT of all is the first
    assert data["closest"][0]["ttft_p99_ms"] == min(t["ttft_p99_ms"] for t in data["candidates"])


def test_an_itl_slo_below_decode_alone_is_refused_at_once(capsys):
    """Issue 42 item 16: the --help example with --slo-itl-ms 12 searched for 18 s and found nothing, while
    its own first line said decode alone takes 12.12 ms. Refused before any search, saying so."""
    assert main(["tune", "--device", "sim:H100", "--slo-itl-ms", "12", "--workload",
                 "decode_bs=64,long_tokens=16384"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "below what decode alone achieves" in err and "12.12 ms" in err


def test_the_sglang_version_asked_for_gets_its_keys(tmp_path, capsys):
    """Issue 40: newer keys only when asked; the header names the SGLang that reads the file as measured."""
    out = tmp_path / "main.yaml"
    assert main(["tune", "--slo-itl-ms", "14", "--workload", SMALL, "--sglang-version", "main", "--budget-s", "20",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert tuple(yaml.safe_load(text)) == SGLANG_KEYS and "sgl-project/sglang main (337ee8ed)" in text
    assert main(["tune", "--slo-itl-ms", "14", "--sglang-version", "0.4"]) == 2
    assert "--sglang-version" in capsys.readouterr().err


@pytest.mark.parametrize("args,words", [
    (["--slo-itl-ms", "-3"], "--slo-itl-ms must be a positive number"),
    (["--slo-itl-ms", "abc"], "--slo-itl-ms must be a positive number"),
    (["--slo-itl-ms", "nan"], "--slo-itl-ms"),
    (["--slo-itl-ms", "inf"], "--slo-itl-ms"),
    (["--slo-itl-ms", "10", "--slo-ttft-ms", "0"], "--slo-ttft-ms"),
    (["--slo-itl-ms", "10", "--budget-s", "-1"], "--budget-s"),
    (["--slo-itl-ms", "10", "--workload", "decode_bs=0"], "decode_bs"),
    (["--slo-itl-ms", "10", "--workload", "batch=3"], "batch"),
    (["--slo-itl-ms", "10", "--workload", "decode_bs"], "KEY=VALUE"),
    (["--slo-itl-ms", "10", "--workload", "/missing.yaml"], "no such workload file"),  # issue 42 item 19
    (["--slo-itl-ms", "10", "--workload", "missing.yaml"], "no such workload file"),
    (["--slo-itl-ms", "10", "--kv-tokens", "4096"], "does not fit the KV cache"),
    (["--slo-itl-ms", "10", "--workload", "long_tokens=50000"], "longer than the model's context"),
    (["--slo-itl-ms", "10", "--device", "sim:B300"], "B300"),
    (["--slo-itl-ms", "10", "--out", "/nonexistent-dir/best.yaml"], "--out"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    assert main(["tune", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdtop tune: error: ") and words in lines[0], lines


def test_a_workload_file_is_plain_yaml_and_its_errors_are_short(tmp_path, capsys):
    """Issue 38 item 8, for `--workload FILE`: nested aliases are refused, a bad value is named short."""
    from tests.conftest import yaml_bomb

    for text, words in [(f"decode_bs: {yaml_bomb(6)}\n", "an anchor (&a)"),
                        (f"decode_bs: [{'1, ' * 20000}1]\n", "got a list"), (f"decode_bs: {'x' * 9999}\n", "...")]:
        path = tmp_path / "w.yaml"
        path.write_text(text)
        assert main(["tune", "--slo-itl-ms", "10", "--workload", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and len(err) < 400, err[:500]


def test_workload_file(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("decode_bs: 16\nlong_tokens: 2048\n")
    sc = parse_workload(str(path), SCENARIOS["sim"])
    assert (sc.decode_bs, sc.long_tokens, sc.decode_prompt) == (16, 2048, SCENARIOS["sim"].decode_prompt)


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="the CPU device needs 2 cores")
def test_cpu_runs_real_rounds_and_keeps_its_budget(model_fp32):
    """The real model on this machine's cores: the default is measured, then the budget stops the search.
    Issue 25 item 6: the budget also cuts the default's own run short (one long prompt of three, not
    all of them), and the default is the device's: cpu's budget 4,096, written as measured."""
    sc = parse_workload("decode_bs=2,decode_prompt=16,long_tokens=96,long_prompts=3,decode_tokens=64",
                        SCENARIOS["cpu"])
    seen = []
    report = tune(lambda: build_engine("cpu", None, loaded_model=model_fp32, kv_capacity_tokens=1024), sc,
                  Slo(1.0), budget_s=1e-3, progress=lambda trial, m: seen.append(trial))
    assert seen == [report.default] and report.run.measured == 1 and not report.run.complete
    r = report.default.result
    assert r.requests == 3 and r.prefill_tok_s > 0 and r.itl_p99_s > 0 and r.decode_only_itl_s > 0
    assert not math.isnan(r.goodput_rps)
    assert report.default.config.split_forward_token_budget == 4096
    assert yaml.safe_load(best_yaml(report, "cpu", "cpu"))["split_forward_token_budget"] == 4096


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="the CPU device needs 2 cores")
def test_the_cpu_scenario_fits_the_cpu_cache(model_fp32):
    """Issue 25 item 1: `tune --device cpu` (its --help example) counts the long prompts held at once,
    as `pdtop bench` does, so its own scenario fits the default 16,384-token cache."""
    engine = build_engine("cpu", None, loaded_model=model_fp32)
    try:
        check_fits(engine, SCENARIOS["cpu"])
        with pytest.raises(PromptError, match="2 long prompts at once"):
            check_fits(engine, parse_workload("decode_bs=10", SCENARIOS["cpu"]))
    finally:
        engine.close()
