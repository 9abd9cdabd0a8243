"""bench/gpu_run.sh, the one call a lent GPU machine makes, run here without a GPU: every step capped, its
files in $OUT, its preflight one line a check."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


NVIDIA_SMI = """#!/bin/sh
# a stand-in for nvidia-smi's two queries bench/gpu_run.sh makes, as an H100 machine answers them
case "$*" in
  *noheader*) echo "NVIDIA H100 80GB HBM3" ;;
  *) echo "name, driver_version, memory.total [MiB], memory.used [MiB], clocks.max.sm [MHz]"
     echo "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 0 MiB, 1980 MHz" ;;
esac
"""


@no_cuda
def test_gpu_run_script_leaves_its_files_without_a_gpu(tmp_path):
    """`bench/gpu_run.sh` (the one call a lent GPU machine makes) on a machine without a GPU: the check
    says so, writes its report and exits 2, the cuda tests skip, and every log lands in $OUT, the check's
    named after the GPU nvidia-smi names (a stand-in answering as an H100 machine does)."""
    out, bin_ = tmp_path / "out", tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_ / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_RUN_TOTAL_S": "400",
           "PATH": f"{bin_}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_run.sh")], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    assert "gpu_run: gpu_check exit 2\n" in r.stdout and "gpu_run: pytest exit 0\n" in r.stdout
    assert "gpu_run: GPU 'NVIDIA H100 80GB HBM3': results gpu_check-h100.json and gpu_check-h100.log" in r.stdout
    assert {p.name for p in out.iterdir()} == {"nvidia_smi.txt", "preflight.txt", "gpu_check-h100.json",
                                              "gpu_check-h100.log", "pytest_cuda.log"}
    assert "NVIDIA H100 80GB HBM3, 580.159.04" in (out / "nvidia_smi.txt").read_text()
    # the check comes first: it gets what the total leaves after the tests' floor of 60 s and the kills'
    # and the import probe's slack (400 - 85 - before), up to 330 s; the tests get what it leaves
    before, check_s, budget = map(int, re.search(r"gpu_run: (\d+) s before the check; it gets (\d+) s "
                                                 r"\(budget (\d+) s\)", r.stdout).groups())
    assert check_s == min(330, 400 - 85 - before) and budget == check_s - 10
    at, tests_s = map(int, re.search(r"gpu_run: (\d+) s before the tests; they get (\d+) s", r.stdout).groups())
    assert tests_s == 400 - at - 5
    # the preflight: one line per check, none of them stopping the run
    lines = (out / "preflight.txt").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["compiler", "python_h", "libcuda", "triton_cache_dir",
                                                  "triton_kernel", "triton_warm"]
    assert all(re.fullmatch(r"preflight: \w+ (ok|FAILED) \(.+\)", line) for line in lines), lines
    assert lines[0] in r.stdout.splitlines()  # shown, not only written
    assert "no CUDA GPU visible to torch" in (out / "gpu_check-h100.log").read_text()
    report = json.loads((out / "gpu_check-h100.json").read_text())
    assert report["mode"] == "gpu" and report["environment"]["preflight"] == lines  # a report all the same
    assert report["errors"]["cuda"].startswith("no CUDA GPU visible") and report["targets"] == dict.fromkeys(TARGETS)
    assert "skipped" in (out / "pytest_cuda.log").read_text()


@pytest.mark.parametrize(("name", "slug"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "4090"), ("", "nogpu"),
])
def test_results_are_named_after_the_gpu(name, slug):
    """gpu_run.sh's name for a GPU, from nvidia-smi's: an H100's results are never filed as an H200's."""
    text = (ROOT / "bench" / "gpu_run.sh").read_text()
    function = text[text.index("gpu_slug() {"):text.index("\n}\n", text.index("gpu_slug() {")) + 3]
    r = subprocess.run(["bash", "-c", f'{function}\ngpu_slug "$1"', "-", name], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and r.stdout == f"{slug}\n", r.stderr


def test_the_warm_up_covers_every_split_count_decode_can_pick():
    """bench/gpu_warm.py compiles a variant per split count, dtype and model shape: every split count
    `decode_splits` picks for any batch on an H100 or H200 (132 SMs, 114 on the PCIe card) and the
    start-up check's (1 and 4), for the check's model and the tests' small one."""
    import gpu_warm

    from pdtop.engine.model.config import synthetic_config
    from pdtop.engine.model.paged_attention import decode_splits

    shapes = {synthetic_config(name).num_kv_heads for name in gpu_warm.SHAPES}
    picked = {decode_splits(rows, kvh, sms) for rows in range(1, 300) for kvh in shapes for sms in (114, 132)}
    assert picked | {1, 4} <= set(gpu_warm.SPLITS)
    jobs = gpu_warm.jobs()
    assert len(jobs) == len(set(jobs)) == len(gpu_warm.SHAPES) * len(gpu_warm.DTYPES) * len(gpu_warm.SPLITS)
    assert jobs[0][1] == "float32" and "synthetic:qwen3-8b" in gpu_warm.SHAPES  # the slow compiles start first


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_the_warm_up_without_a_gpu_fails_in_one_line_per_job(tmp_path):
    """The warm-up's jobs run in spawned processes (each its own CUDA context) and each says how it ended;
    here every one fails (no GPU) and the run says so, exit 1, in one line per job and a total."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_warm.py"), "--workers", "1"], env=env,
                       capture_output=True, text=True, timeout=240)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 21, r.stdout + r.stderr
    assert lines[-1] == "warm: 0 of 20 variants in " + lines[-1].split(" in ")[1] and lines[-1].endswith(
        "s on 1 process")
