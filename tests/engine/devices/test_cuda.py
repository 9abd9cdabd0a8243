"""The CUDA green-context device: clear failures without CUDA here, real splits and overlap on a GPU."""
import ctypes.util
import importlib.util
import subprocess
import sys
import time

import pytest
import torch

from pdtop.engine.devices.base import Work
from pdtop.engine.devices.cuda import CudaDevice
from pdtop.engine.devices.cuda_setup import cuda_unavailable_reason
from pdtop.engine.devices.green_ctx import (
    GreenContexts,
    call,
    check_driver_versions,
    load_driver,
    round_sms,
    sm_granularity,
)
from pdtop.engine.errors import DeviceError

HAS_CUDA_PYTHON = importlib.util.find_spec("cuda") is not None and (
    importlib.util.find_spec("cuda.bindings") is not None or importlib.util.find_spec("cuda.cuda") is not None)
HAS_CUDA = torch.cuda.is_available() and HAS_CUDA_PYTHON
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the behaviour without CUDA")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# -- granularity (pure) ---------------------------------------------------------------------
@pytest.mark.parametrize("major,multiple", [(7, 2), (8, 2), (9, 8), (10, 8), (12, 8)])
def test_granularity_by_compute_capability(major, multiple):
    assert sm_granularity(major) == multiple


@pytest.mark.parametrize("count,major,expected", [
    (13, 7, 14), (14, 7, 14), (1, 7, 2),
    (13, 8, 14), (78, 8, 78), (1, 8, 4),  # 8.x: multiples of 2, at least 4
    (111, 9, 112), (112, 9, 112), (113, 9, 120), (1, 9, 8),
    (100, 10, 104), (20, 10, 24),
    (52, 12, 56), (8, 12, 8),
])
def test_round_sms(count, major, expected):
    assert round_sms(count, major) == expected


@pytest.mark.parametrize("count,major,error", [(0, 9, ValueError), (-8, 9, ValueError), (8, 5, DeviceError)])
def test_round_sms_rejects(count, major, error):
    with pytest.raises(error):
        round_sms(count, major)


# -- driver versions (pure) -----------------------------------------------------------------
@pytest.mark.parametrize("driver,bindings,needle", [
    (12030, "12.6.2", "CUDA 12.4+ driver"),
    (12040, "12.6.2", "CUDA 12.5+ driver"),
    (12080, "13.4.4", "install cuda-python 12.x"),
])
def test_driver_version_errors(driver, bindings, needle):
    with pytest.raises(DeviceError, match=needle.replace(".", r"\.").replace("+", r"\+")):
        check_driver_versions(driver, bindings)


@pytest.mark.parametrize("driver,bindings", [(12050, "12.6.2"), (12090, "12.9.0"), (13000, "13.4.4")])
def test_driver_versions_ok(driver, bindings):
    check_driver_versions(driver, bindings)


# -- without CUDA ---------------------------------------------------------------------------
def test_modules_import_without_touching_cuda():
    r = _run("import sys, pdtop.engine.devices.cuda, pdtop.engine.devices.green_ctx\n"
             "bad = [m for m in sys.modules if m.startswith(('textual', 'pdtop.telemetry', 'pdtop.ui'))]\n"
             "assert not bad, bad\nprint('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@no_cuda
def test_constructing_says_what_is_missing():
    reason = cuda_unavailable_reason()
    assert reason
    with pytest.raises(DeviceError) as info:
        CudaDevice()
    msg = str(info.value)
    assert msg.startswith("cuda device unavailable: ") and "\n" not in msg
    if torch.version.cuda is None:
        assert "CPU-only build" in msg
    elif not torch.cuda.is_available():
        assert "sees no CUDA GPU" in msg
    if not HAS_CUDA_PYTHON:
        assert "cuda-python is not installed" in msg
        if torch.version.cuda is None:  # issue 25 item 16: the CPU-only torch is the first problem
            assert msg.index("CPU-only build") < msg.index("cuda-python"), msg
    assert "(pip" not in msg and "))" not in msg, msg  # no hint nested in brackets


def test_without_cuda_python_the_error_names_it():
    # `sys.modules["cuda"] = None` makes `import cuda...` fail as on a machine without cuda-python.
    r = _run("import sys; sys.modules['cuda'] = None\n"
             "from pdtop.engine.errors import DeviceError\n"
             "from pdtop.engine.devices import green_ctx\n"
             "from pdtop.engine.devices.cuda import CudaDevice\n"
             "for f in (green_ctx.load_driver, green_ctx.GreenContexts, CudaDevice):\n"
             "    try:\n        f()\n    except DeviceError as e:\n        print(e)\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and all("cuda-python is not installed" in line for line in lines), lines


@pytest.mark.skipif(not HAS_CUDA_PYTHON or ctypes.util.find_library("cuda") is not None,
                    reason="needs cuda-python and no NVIDIA driver")
def test_without_driver_the_error_names_it():
    with pytest.raises(DeviceError, match=r"^cuInit failed: no NVIDIA driver"):
        GreenContexts()


@pytest.mark.skipif(not HAS_CUDA_PYTHON, reason="needs cuda-python")
def test_call_names_a_missing_binding():
    with pytest.raises(DeviceError, match="cuNoSuchCall is missing from cuda-python"):
        call(load_driver(), "cuNoSuchCall")


# -- on a GPU -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def device():
    dev = CudaDevice()
    yield dev
    dev.close()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU, CUDA torch and cuda-python")
def test_every_level_gets_its_sms(device):
    from pdtop.engine.devices.cuda_setup import cuda_device_info

    assert cuda_device_info()["sms"] == device.units
    assert device.groups[0] == (device.units, 0) and device.groups[-1] == (0, device.units)
    for (p, d), (rp, rd) in zip(device.groups, device.realized, strict=True):
        assert rp >= p and rd >= d and rp + rd <= device.units
        if p and d:
            assert p % sm_granularity(device.cc_major) == 0


def _matmuls(n: int, size: int, seed: int) -> Work:
    """n steps of a = tanh(a @ w + c), a contraction: rounding differences between SM counts shrink."""
    def run():
        g = torch.Generator(device="cuda").manual_seed(seed)
        a, w, c = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        w = w * (0.25 / size ** 0.5)
        for _ in range(n):
            a = torch.tanh(a @ w + c)
        return a.float().mean(dim=0)
    return Work("prefill", 2.0 * n * size ** 3, 0.0, run)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU, CUDA torch and cuda-python")
def test_fewer_sms_run_slower(device):
    """A compute-bound kernel on the smallest decode share is clearly slower than on the whole device."""
    work = _matmuls(20, 8192, 0)

    def timed(whole: bool) -> float:
        for _ in range(2):  # warm-up, then timed
            t = time.perf_counter()
            device.run_whole(work) if whole else device.run_decode(work)
        return time.perf_counter() - t

    device.set_level(1)  # level 1 gives decode its smallest share
    t_whole, t_small = timed(True), timed(False)
    assert t_small > 1.5 * t_whole, (t_small, t_whole, device.groups[1])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU, CUDA torch and cuda-python")
def test_decode_runs_while_prefill_is_in_flight(device):
    device.set_level(len(device.groups) // 2)
    expected_prefill = _matmuls(200, 4096, 1).run()
    expected_decode = _matmuls(2, 512, 2).run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    device.submit_prefill(_matmuls(200, 4096, 1))
    launched = time.perf_counter() - t0
    assert device.prefill_busy()
    decodes = []
    while device.prefill_busy() and len(decodes) < 1000:
        decodes.append(device.run_decode(_matmuls(2, 512, 2)))
    out = device.wait_prefill()
    total = time.perf_counter() - t0
    assert not device.prefill_busy()
    assert len(decodes) >= 3, (len(decodes), launched, total)
    assert launched < total / 2
    assert all(torch.allclose(x, expected_decode, atol=1e-2) for x in decodes)
    assert torch.allclose(out, expected_prefill, atol=1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU, CUDA torch and cuda-python")
def test_set_groups_rebuilds_levels(device):
    old = list(device.groups)
    mid = old[1:-1]
    device.set_groups([old[0], mid[-1], old[-1]])
    assert len(device.realized) == 3 and device.level < 3
    device.set_groups(old)
    assert device.groups == old


@no_cuda
def test_device_info_says_what_is_missing():
    from pdtop.engine.devices.cuda_setup import cuda_device_info

    with pytest.raises(DeviceError, match=r"^cuda device unavailable: "):
        cuda_device_info()
