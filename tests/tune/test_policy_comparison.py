"""Comparing the ways on one seeded workload (`pdtop tune --policies`): each policy's best under the SLOs,
and disagg charged its second device."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = "decode_bs=8,decode_prompt=512,long_tokens=4096,long_prompts=2"


def test_tune_compares_the_ways_and_charges_disagg_its_second_device():
    proc = subprocess.run([sys.executable, "-m", "pdtop", "tune", "--device", "sim:H100", "--slo-itl-ms", "20",
                           "--slo-ttft-ms", "1000", "--policies", "pdmux,chunked,disagg", "--link", "rdma100",
                           "--workload", SMALL, "--budget-s", "20", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["policy"]: r for r in json.loads(proc.stdout)["policies"]}
    assert set(rows) == {"pdmux", "chunked", "disagg"}
    assert {p: r["devices"] for p, r in rows.items()} == {"pdmux": 1, "chunked": 1, "disagg": 2}
    d = rows["disagg"]
    assert d["config"] == "1P1D over rdma100" and d["goodput_rps_per_device"] == pytest.approx(d["goodput_rps"] / 2)
    assert rows["chunked"]["config"].startswith("chunk_size=") and rows["chunked"]["tried"] > 1
    assert rows["pdmux"]["config"].startswith(("sm_group_num=", "manual_divisions="))
    assert d["itl_p99_ms"] < rows["chunked"]["itl_p99_ms"]  # disagg decodes on its own GPU
