"""bench/gpu_check.py without a GPU: `--smoke` through every section that needs none, with what the lent
GPU machine lacks unimportable; a failing section, a SIGTERM and a SIGKILL each leave a report with its
verdict; the device section's record of a table the driver cut to its whole-device levels, from the
cuda device on the stand-in driver, fails the verdict; the one-step graph-against-eager comparison."""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from gpu_targets import TARGETS, targets

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    """gpu_check's arguments for a smoke run in-process."""
    args = {"out": str(tmp_path / "gpu_check.json"), "smoke": True, "budget": 120.0, "steps": 4, "eager_steps": 4,
            "layers": 1, "kv_tokens": 4096, "preflight": None, "connections_probe": False, "probe_split": "80,52",
            "policies_child": False}
    return argparse.Namespace(**{**args, **kw})


GPU_MACHINE_LACKS = ("gguf", "websockets", "orjson", "textual", "fastapi", "uvicorn", "httptools", "openai",
                     "pytest_asyncio")


def test_cli_json_and_synthetic_models_need_neither_orjson_nor_psutil():
    """What the lent GPU machine's cuda tests run without the carried wheels: the CLI's parser (every
    command module is imported to build it), `encode` (`pdtop tune --json`), and a synthetic model on the
    CPU (its memory check reads /proc/meminfo without psutil)."""
    r = _run("import sys\n"
             f"for m in {(*GPU_MACHINE_LACKS, 'psutil')!r}:\n    sys.modules[m] = None\n"
             "from pdtop.cli import build_parser\n"
             "build_parser()\n"
             "from pdtop.telemetry.encode import encode\n"
             "from pdtop.engine.model import synthetic\n"
             "m = synthetic.synthetic_model('synthetic:smollm2-135m', dtype='float32', num_layers=1)\n"
             "print(encode({'layers': m.config.num_layers}), synthetic._available_ram() > 0)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ['{"layers":1}', "True"]


def test_gpu_check_smoke_runs_without_packages_the_gpu_machine_lacks(tmp_path):
    """`bench/gpu_check.py --smoke` (CPU, a 2-layer model) drives pdtop's runner, engine and scheduler
    through every section that needs no GPU, with what the lent GPU machine lacks unimportable."""
    out = tmp_path / "gpu_check.json"
    code = ("import runpy, sys\n"
            f"for m in {GPU_MACHINE_LACKS!r}:\n    sys.modules[m] = None\n"
            f"sys.argv = ['gpu_check.py', '--smoke', '--out', {str(out)!r}]\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    r = _run(code)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["errors"] == {} and report["skipped"] == {} and report["mode"] == "smoke"
    assert "running" not in report and "policy_running" not in report  # every section ended
    assert report["device"]["name"] == "cpu" and report["levels"] == []
    assert report["environment"]["torch"] == torch.__version__
    eager = report["decode_step"]["eager"]["alone"]
    assert eager["wall_ms"]["n"] == 20 and eager["wall_ms"]["p50"] > 0
    assert eager["graph_replayed"] is False  # said for every decode figure; the CPU has no graphs
    assert report["decode_step"]["eager"]["steps"] == 20  # --eager-steps follows --steps up to 100
    assert report["graph_vs_eager"] == "needs the cuda device with CUDA graphs"
    assert set(report["itl_ms"]) == {"decode_only", "pdmux_under_prefill", "chunked_64", "chunked_32"}
    assert all(v > 0 for v in report["itl_ms"].values())
    assert report["policies"]["chunked_32"]["chunk_size"] == 32 and report["policies"]["pdmux"]["levels"]
    assert report["runtime"]["kv_cache"]["tokens"] == 4096
    assert "ITL p99 ms: decode_only" in r.stdout  # the summary table
    # decode-only: 30 rounds of 4 requests, each request's gap into them left out (issue 30)
    assert report["policies"]["pdmux"]["decode_only_itl_ms"]["n"] == 4 * 29
    chunked = report["policies"]["chunked_32"]
    assert chunked["mixed_steps"] == 128 // 32 and chunked["decode_graphs"] is False and chunked["decode_graphs_note"]
    assert chunked["itl_ms"]["n"] > 0 and chunked["decode_steps"] is None  # the decoder's counts: CUDA only
    # where the p99 comes from: the worst rounds, longest first, and each long prompt's worst ITL
    worst = report["policies"]["pdmux"]["worst_rounds"]
    assert 0 < len(worst) <= 5 and [w["itl_ms"] for w in worst] == sorted((w["itl_ms"] for w in worst), reverse=True)
    assert abs(worst[0]["itl_ms"] - report["policies"]["pdmux"]["itl_ms"]["max"]) <= 0.01
    assert max(report["policies"]["pdmux"]["itl_max_ms_by_prompt"]) == worst[0]["itl_ms"]
    # every target is there; what a CPU cannot measure is null and the table says so
    assert set(report["targets"]) == set(TARGETS) and report["targets"]["realized_equals_requested"] is None
    assert "target graphs_replayed_on_every_level: not measured (no levels in the report)" in r.stdout


def test_gpu_check_section_that_fails_frees_its_requests(tmp_path, gpu_check, monkeypatch):
    """A decode figure that raises (on the GPU: any error mid-section) is recorded in `errors`, and its
    32 requests' KV goes back to the runner's pool, so the sections after it do not run out of KV."""
    calls = []

    def failing(*args, **kw):
        calls.append(args)
        raise RuntimeError("a figure failed")

    monkeypatch.setattr(gpu_check, "timed", failing)
    check = gpu_check.Check(_args(tmp_path, budget=60.0, steps=2, layers=1))
    check.report.run("runtime", check.runtime)
    check.report.run("decode_step", check.decode)
    runner = check.runner
    assert calls and "a figure failed" in check.data["errors"]["decode_step"]
    assert runner is not None and runner.kv.pool.used_blocks == 0


def test_gpu_check_stopped_by_its_timeout_keeps_results_and_prints_the_table(tmp_path):
    """SIGTERM (what `timeout` in bench/gpu_run.sh sends) in the middle of a section: the sections done
    stay in the JSON, the one stopped is recorded as such, the summary table is still printed."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("[gpu_check] decode_step"):
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 124, "".join(lines) + rest
    report = json.loads(out.read_text())
    assert "SIGTERM" in report["skipped"]["decode_step"] and report["runtime"]["dtype"] == "float32"
    assert "policies" not in report["seconds"] and "ITL p99" not in rest
    assert rest.strip().splitlines()[-1].startswith("skipped decode_step: stopped by SIGTERM")  # the table's end



def test_a_killed_run_still_has_its_verdict(tmp_path):
    """SIGKILL mid-run (no handler runs: the timeout's second signal, the device tool's own limit): the JSON
    last saved holds the targets of what it had measured, computed at that save (issue 43 item 6)."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("[gpu_check] decode_step"):
                proc.kill()
                break
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    report = json.loads(out.read_text())
    assert "runtime" in report["seconds"] and "policies" not in report["seconds"]
    assert report["running"] == "decode_step"  # the section the process died in
    assert set(report["targets"]) == set(TARGETS) and set(report["target_notes"]) == set(TARGETS)
    assert report["targets"] == targets(report)[0]  # the verdict of the report as it stands


def test_replayed_logits_are_compared_with_eager_ones(gpu_check):
    """The check's one-step comparison (issue 43 item 3): a replayed graph passes only if it replayed and
    its logits are the eager step's within 2% of the largest; stale, garbled or NaN logits fail."""
    g = torch.Generator().manual_seed(0)
    eager = torch.randn(4, 1000, generator=g) * 10
    same = gpu_check.compare_logits(eager, eager.clone(), True)
    assert same["ok"] and same["max_abs_diff"] == 0 and same["rows"] == same["rows_same_argmax"] == 4
    rounded = gpu_check.compare_logits(eager, eager.to(torch.bfloat16).float(), True)
    assert rounded["ok"] and 0 < rounded["max_abs_diff"] < 0.02 * rounded["max_abs_logit"]
    assert not gpu_check.compare_logits(eager, eager.clone(), False)["ok"]  # eager twice is no replay
    garbled = eager.clone()
    garbled[2] = torch.randn(1000, generator=g) * 10
    bad = gpu_check.compare_logits(eager, garbled, True)
    assert not bad["ok"] and bad["rows_same_argmax"] == 3
    assert not gpu_check.compare_logits(eager, torch.zeros_like(eager), True)["ok"]  # a buffer never written
    assert not gpu_check.compare_logits(eager, eager[:3], True)["ok"]
    nan = eager.clone()
    nan[0, 0] = math.nan
    got = gpu_check.compare_logits(eager, nan, True)
    assert not got["ok"] and gpu_check._clean(got)["max_abs_diff"] is None  # strict JSON: null


def _facts(gpu_check, drv) -> tuple[dict, list[dict]]:
    """The device section's record of the cuda device on the stand-in driver, SMs measured as on a GPU."""
    from fake_cuda_driver import FakeNvrtc, fake_cuda_device

    dev = fake_cuda_device(drv)
    try:
        device, levels = gpu_check.device_facts(dev)
        for entry, m in zip(levels, dev.measure_sms(nvrtc=FakeNvrtc(), clock=drv.clock), strict=True):
            entry["measured_sms"] = m
    finally:
        dev.close()
    return device, levels


def test_a_table_cut_to_its_whole_device_levels_fails_the_verdict(gpu_check):
    """Issue 43 item 1, from the device to the verdict: the driver refuses every split level, the device
    runs on (132, 0) and (0, 132), and the report says what was asked, what was dropped and why; the
    verdict is not met on the levels, nor on the SMs (nothing ran split)."""
    from fake_cuda_driver import FakeDriver

    from pdtop.engine.roofline.partition import stream_groups

    table = stream_groups(132, 9)
    device, levels = _facts(gpu_check, FakeDriver(fail_create={d for p, d in table if p and d}))
    assert [x["realized"] for x in levels] == [[132, 0], [0, 132]]
    assert device["levels_requested"] == [list(g) for g in table] and device["sms"] == 132
    assert [x["level"] for x in device["dropped_levels"]] == list(range(1, len(table) - 1))
    assert all(x["reason"].startswith("cuGreenCtxCreate failed") for x in device["dropped_levels"])
    verdict, notes = targets({"mode": "gpu", "device": device, "levels": levels})
    assert verdict["realized_equals_requested"] is False and verdict["measured_sms_match_realized"] is False, notes


def test_one_refused_level_fails_realized_and_the_others_are_measured(gpu_check):
    from fake_cuda_driver import FakeDriver

    device, levels = _facts(gpu_check, FakeDriver(fail_create={52}))  # (80, 52)'s decode side
    assert [x["requested"] for x in device["dropped_levels"]] == [[80, 52]]
    verdict, notes = targets({"mode": "gpu", "device": device, "levels": levels})
    assert verdict["realized_equals_requested"] is False and "level 5 [80, 52]" in notes["realized_equals_requested"]
    assert verdict["measured_sms_match_realized"] is True, notes  # the five split levels that ran, on their own SMs


def test_sections_before_the_policies_leave_them_their_time(tmp_path, gpu_check):
    """With 50 s of the budget left, a figure that needs 5 s beside the 90 s kept for the policies is
    skipped, saying so, and the policies, which need 45 s, still run (issue 43 item 5)."""
    elapsed = gpu_check.time.perf_counter() - gpu_check.STARTED
    report = gpu_check.Report(tmp_path / "gpu_check.json", elapsed + 50.0, "gpu")
    ran = []
    report.run("decode_step", lambda: ran.append("decode_step"), need_s=5, reserve_s=90)
    report.run("policies", lambda: ran.append("policies"), need_s=45)
    assert ran == ["policies"]
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["skipped"]["decode_step"].endswith("about 5 s needed beside the 90 s kept for the policies")
    assert "policies" in saved["seconds"] and set(saved["targets"]) == set(TARGETS)


ABORT = """import json, os, sys
json.dump({{"policies": {{"pdmux": {{"itl_ms": {{"p99": 12.0}}}}}}, "itl_ms": {{"pdmux_under_prefill": 12.0,
           "decode_only": 10.0}}, "errors": {{}}, "skipped": {{}}, "policy_running": "chunked_64"}}, open({out!r}, "w"))
sys.stderr.write("terminate called after throwing an instance of 'c10::AcceleratorError'\\n"
                 "  what():  CUDA error: context is destroyed\\nframe #4: c10::TensorImpl::~TensorImpl()\\n")
sys.stderr.flush()
os.abort()
"""


def test_a_policies_process_that_aborts_keeps_what_it_saved_and_the_check_goes_on(tmp_path, gpu_check,
                                                                                    monkeypatch, capsys):
    """The policies run in a child process: one that dies of SIGABRT in its second policy (as the first H100
    run's process did in a tensor's destructor) leaves the first policy's figures, the reason it died and
    the policy it died in; the sections after it still run and the verdict is saved."""
    monkeypatch.setattr(gpu_check.Check, "_policies_command",
                        lambda self, out: [sys.executable, "-c", ABORT.format(out=str(out))])
    check = gpu_check.Check(_args(tmp_path))
    check.report.run("policies", check.policies)
    check.report.run("max_connections", check.connections)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["policies"]["pdmux"]["itl_ms"]["p99"] == 12.0 and saved["itl_ms"]["decode_only"] == 10.0
    assert saved["errors"]["policies"] == "its process died of SIGABRT: what(): CUDA error: context is destroyed"
    assert saved["skipped"]["policies.chunked_64"] == "the policies' process ended during it"
    assert saved["max_connections"] == "needs a GPU" and "running" not in saved and set(saved["targets"]) == set(
        TARGETS)
    assert "what():  CUDA error: context is destroyed" in capsys.readouterr().err  # its stderr, in the log
    assert not list(Path(gpu_check.tempfile.gettempdir()).glob(f"gpu_check_policies_{os.getpid()}.json"))


def test_why_a_process_died_is_read_from_its_stderr(gpu_check):
    """The first H100 run's log as the check's process wrote it: the C++ exception's `what():` line."""
    log = (Path(__file__).resolve().parents[2] / "bench" / "results" / "h100-run1" / "gpu_check-h100.log").read_text()
    assert gpu_check._death(log) == "what(): CUDA error: context is destroyed"
    assert gpu_check._ended(-signal.SIGABRT) == "died of SIGABRT" and gpu_check._ended(1) == "exited 1"
    assert gpu_check._death('Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n') == (
        "ValueError: bad")
    assert gpu_check._death("") == "nothing on stderr"
