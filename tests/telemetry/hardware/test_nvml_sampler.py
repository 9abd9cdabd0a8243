"""NVML sampler: unavailable with a reason and "n/a" values here; real readings on a GPU."""
import ctypes.util
import importlib.util
import subprocess
import sys
import time

import pytest

from pdtop.telemetry.hardware.nvml_sampler import KEYS, NA, NvmlSampler

HAS_PYNVML = importlib.util.find_spec("pynvml") is not None
HAS_NVML_LIB = ctypes.util.find_library("nvidia-ml") is not None


def test_imports_without_nvml():
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['pynvml'] = None\n"
                        "from pdtop.telemetry.hardware.nvml_sampler import NvmlSampler\n"
                        "s = NvmlSampler(); print(s.available, '|', s.reason, '|', set(s.sample().values()))"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False | nvidia-ml-py is not installed: pip install 'pdtop[gpu]' | {'n/a'}"


@pytest.mark.skipif(not HAS_PYNVML or HAS_NVML_LIB, reason="needs nvidia-ml-py and no NVIDIA driver")
def test_no_driver_reports_reason_and_na():
    s = NvmlSampler()
    assert not s.available
    assert "libnvidia-ml" in s.reason and "no NVIDIA driver" in s.reason
    sample = s.sample()
    assert set(sample) == set(KEYS) and set(sample.values()) == {NA}
    assert s.describe()["available"] is False
    s.close()


def test_bad_index_never_raises():
    s = NvmlSampler(index=999)
    assert not s.available and s.reason
    assert set(s.sample().values()) == {NA}
    s.close()


@pytest.mark.cuda
@pytest.mark.skipif(not (HAS_PYNVML and HAS_NVML_LIB), reason="needs an NVIDIA driver and nvidia-ml-py")
def test_samples_a_real_gpu():
    s = NvmlSampler()
    assert s.available, s.reason
    first = s.sample()
    assert set(first) == set(KEYS)
    assert isinstance(first["mem_total_mib"], int) and first["mem_total_mib"] > 0
    for key in ("mem_busy_pct", "gpu_util_pct"):
        assert first[key] == NA or 0 <= first[key] <= 100
    time.sleep(0.15)
    second = s.sample()
    if s.gpm:  # Hopper and newer: two samples >= 100 ms apart give numbers
        for key in ("dram_bw_util_pct", "sm_util_pct", "sm_occupancy_pct"):
            assert second[key] == NA or 0.0 <= second[key] <= 100.0
    s.close()
    assert set(s.sample().values()) == {NA}
