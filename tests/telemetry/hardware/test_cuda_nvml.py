"""NVML watches the engine's GPU, found by UUID or PCI bus id: NVML and CUDA number GPUs differently.

NVML's library is replaced by a stand-in module listing three GPUs in NVML's own order;
the sampler under test is the real one.
"""
from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from pdtop.telemetry.hardware.nvml_sampler import NA, NvmlSampler, match_nvml_device

GPUS = [  # NVML's order (by PCI bus); CUDA's device 0 may be any of them
    ("GPU-aaaaaaaa-0000-0000-0000-000000000000", b"00000000:18:00.0", "NVIDIA H200"),
    ("GPU-bbbbbbbb-0000-0000-0000-000000000000", b"00000000:65:00.0", "NVIDIA H200"),
    ("GPU-cccccccc-0000-0000-0000-000000000000", b"00000000:B3:00.0", "NVIDIA H100 80GB HBM3"),
]


def fake_pynvml() -> ModuleType:
    nv = ModuleType("pynvml")
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(GPUS)
    nv.nvmlDeviceGetHandleByIndex = lambda i: SimpleNamespace(i=i) if 0 <= i < len(GPUS) else _raise(i)
    nv.nvmlDeviceGetUUID = lambda h: GPUS[h.i][0]
    nv.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=GPUS[h.i][1])
    nv.nvmlDeviceGetName = lambda h: GPUS[h.i][2]
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=(h.i + 1) << 30, total=141 << 30)
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 1, 2
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage"):
        setattr(nv, name, _not_supported)  # as NVML answers where a GPU lacks a counter: "n/a"
    return nv


def _raise(i: int):
    raise RuntimeError(f"invalid index {i}")


def _not_supported(*args):
    raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


@pytest.fixture
def nvml(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


@pytest.mark.parametrize("uuid,pci,index,how", [
    ("GPU-cccccccc-0000-0000-0000-000000000000", None, 2, "uuid"),
    ("gpu-BBBBBBBB-0000-0000-0000-000000000000", None, 1, "uuid"),
    (None, "0000:65:00.0", 1, "pci_bus_id"),  # CUDA writes a 4-digit domain, NVML an 8-digit one
    (None, "0000:b3:00.0", 2, "pci_bus_id"),
    ("GPU-unknown", "0000:18:00.0", 0, "pci_bus_id"),
])
def test_the_engines_gpu_is_found_by_uuid_or_bus_id(nvml, uuid, pci, index, how):
    assert match_nvml_device(nvml, uuid, pci) == (index, how)
    s = NvmlSampler(uuid=uuid, pci_bus_id=pci)
    assert s.available and s.index == index and s.describe()["matched_by"] == how
    sample = s.sample()
    assert sample["mem_used_mib"] == (index + 1) * 1024 and sample["gpu_util_pct"] == NA
    s.close()


def test_no_match_is_unavailable_with_the_reason(nvml):
    s = NvmlSampler(uuid="GPU-none", pci_bus_id="0000:01:00.0")
    assert not s.available and "GPU-none" in s.reason and "0000:01:00.0" in s.reason
    assert set(s.sample().values()) == {NA}


def test_without_ids_it_watches_nvml_index(nvml):
    s = NvmlSampler(1)
    assert s.available and s.describe()["matched_by"] == "index" and s.name == "NVIDIA H200"
