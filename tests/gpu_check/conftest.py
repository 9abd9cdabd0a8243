"""The GPU check's tests (bench/gpu_check.py, bench/gpu_targets.py, bench/gpu_run.sh): bench/ on the path,
as when its scripts run (they import each other from their folder), and the stand-in CUDA driver's folder
(tests/engine/devices); `gpu_check` is the script loaded as a module."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _folder in (ROOT / "bench", ROOT / "tests" / "engine" / "devices"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@pytest.fixture
def gpu_check(monkeypatch):
    """bench/gpu_check.py as a module; importing it sets CUDA_DEVICE_MAX_CONNECTIONS if unset, which
    monkeypatch puts back after."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "32"))
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
