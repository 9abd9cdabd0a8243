"""bench/gpu_run.sh, the one call a lent GPU machine makes, run here without a GPU: every step capped, its
files in $OUT, its preflight one line a check."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


@no_cuda
def test_gpu_run_script_leaves_its_files_without_a_gpu(tmp_path):
    """`bench/gpu_run.sh` (the one call a lent GPU machine makes) on a machine without a GPU: the check
    says so and exits 2, the cuda tests skip, and every log lands in $OUT."""
    script = ROOT / "bench" / "gpu_run.sh"
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_RUN_TOTAL_S": "400"}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "gpu_run: gpu_check exit 2\n" in r.stdout and "gpu_run: pytest exit 0\n" in r.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {"nvidia_smi.txt", "preflight.txt", "gpu_check.log",
                                                   "pytest_cuda.log"}
    assert len(list(tmp_path.iterdir())) < 8  # the device tool brings back fewer than 8 files
    # the check gets what the total leaves after the tests' 120 s and the kills' slack: 400 - 145 - before
    before, check_s, budget = map(int, re.search(r"gpu_run: (\d+) s before the check; it gets (\d+) s "
                                                 r"\(budget (\d+) s\)", r.stdout).groups())
    assert check_s == 400 - 145 - before and budget == check_s - 10
    # the preflight: one line per check, none of them stopping the run
    lines = (tmp_path / "preflight.txt").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["compiler", "python_h", "libcuda", "triton_cache_dir",
                                                  "triton_kernel"]
    assert all(re.fullmatch(r"preflight: \w+ (ok|FAILED) \(.+\)", line) for line in lines), lines
    assert lines[0] in r.stdout.splitlines()  # shown, not only written
    assert "no CUDA GPU visible to torch" in (tmp_path / "gpu_check.log").read_text()
    assert "skipped" in (tmp_path / "pytest_cuda.log").read_text()
