"""`host.machine_line`: the machine every benchmark names beside its figures (issue 27 §1)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdtop.engine.devices import host


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_the_line_names_the_cpu_its_flags_and_the_load():
    info = Path("/proc/cpuinfo").read_text()
    model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
    flags = set(next(line for line in info.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    line = host.machine_line()
    assert line.startswith(f"CPU {model}; ")
    head, _, rest = line.removeprefix(f"CPU {model}; ").partition(";")
    have = head.partition(", no ")[0].split()
    for f in host.FLAGS:  # avx2, fma, avx512f, avx512_vnni, avx512_bf16, amx_tile: listed exactly when the CPU has them
        assert (f in have) == (f in flags), (f, line)
    assert f"{os.cpu_count()} cores" in rest and "load average " in rest
    assert host.machine()["flags"] == {f: f in flags for f in host.FLAGS}
