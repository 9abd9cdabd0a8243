"""The CUDA green-context device: clear failures without CUDA here, real splits and overlap on a GPU."""
import ctypes.util
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pdtop.analysis.gpu_targets import TARGETS
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


# -- the GPU check script -------------------------------------------------------------------
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
    import json

    script = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
    out = tmp_path / "gpu_check.json"
    code = ("import runpy, sys\n"
            f"for m in {GPU_MACHINE_LACKS!r}:\n    sys.modules[m] = None\n"
            f"sys.argv = ['gpu_check.py', '--smoke', '--out', {str(out)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    r = _run(code)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["errors"] == {} and report["skipped"] == {} and report["mode"] == "smoke"
    assert report["device"]["name"] == "cpu" and report["levels"] == []
    assert report["environment"]["torch"] == torch.__version__
    eager = report["decode_step"]["eager"]["alone"]
    assert eager["wall_ms"]["n"] == 20 and eager["wall_ms"]["p50"] > 0
    assert eager["graph_replayed"] is False  # said for every decode figure; the CPU has no graphs
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
    # every target is there; what a CPU cannot measure is null and the table says so
    assert set(report["targets"]) == set(TARGETS) and report["targets"]["realized_equals_requested"] is None
    assert "target graphs_replayed_on_every_level: not measured (no levels in the report)" in r.stdout


def test_gpu_check_section_that_fails_frees_its_requests(tmp_path, monkeypatch):
    """A decode figure that raises (on the GPU: any error mid-section) is recorded in `errors`, and its
    32 requests' KV goes back to the runner's pool, so the sections after it do not run out of KV."""
    import argparse
    import importlib.util

    # importing it sets CUDA_DEVICE_MAX_CONNECTIONS if unset: monkeypatch puts the environment back after
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "32"))
    path = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", path)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    calls = []

    def failing(*args, **kw):
        calls.append(args)
        raise RuntimeError("a figure failed")

    monkeypatch.setattr(gpu_check, "timed", failing)
    args = argparse.Namespace(out=str(tmp_path / "gpu_check.json"), smoke=True, budget=60.0, steps=2, layers=1,
                              kv_tokens=4096, preflight=None, connections_probe=False, probe_split="80,52")
    check = gpu_check.Check(args)
    check.report.run("runtime", check.runtime)
    check.report.run("decode_step", check.decode)
    runner = check.runner
    assert calls and "a figure failed" in check.data["errors"]["decode_step"]
    assert runner is not None and runner.kv.pool.used_blocks == 0


def test_gpu_check_stopped_by_its_timeout_keeps_results_and_prints_the_table(tmp_path):
    """SIGTERM (what `timeout` in bench/gpu_run.sh sends) in the middle of a section: the sections done
    stay in the JSON, the one stopped is recorded as such, the summary table is still printed."""
    import json
    import signal

    script = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
    out = tmp_path / "gpu_check.json"
    proc = subprocess.Popen([sys.executable, str(script), "--smoke", "--out", str(out)], stdout=subprocess.PIPE,
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


@no_cuda
def test_device_info_says_what_is_missing():
    from pdtop.engine.devices.cuda_setup import cuda_device_info

    with pytest.raises(DeviceError, match=r"^cuda device unavailable: "):
        cuda_device_info()


@no_cuda
def test_gpu_run_script_leaves_its_files_without_a_gpu(tmp_path):
    """`bench/gpu_run.sh` (the one call a lent GPU machine makes) on a machine without a GPU: the check
    says so and exits 2, the cuda tests skip, and every log lands in $OUT."""
    import re

    script = Path(__file__).resolve().parents[3] / "bench" / "gpu_run.sh"
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
