"""GPU hardware metrics from NVML (nvidia-ml-py), for the dashboard's `hw` events.

Every value a device or driver lacks is the string "n/a"; `sample()` never raises.
`mem_busy_pct` is NVML's memory utilization: the percent of time device memory was
being read or written in the last sample period, not the share of bandwidth used.
Bandwidth is `dram_bw_util_pct`, a GPM metric (Hopper and newer), like SM utilization
and occupancy; GPM metrics compare two samples at least 100 ms apart, so the sampler
keeps the previous one between calls and reports "n/a" until it has a pair.

NVML numbers GPUs its own way (PCI order), CUDA and torch theirs (fastest first, and
CUDA_VISIBLE_DEVICES renumbers them), so the engine's GPU is found by its UUID or PCI bus
id (`match_nvml_device`), not by its index.
"""
from __future__ import annotations

import threading
import time
from typing import Any

NA = "n/a"
GPM_MIN_INTERVAL_S = 0.1
KEYS = ("gpu_util_pct", "mem_busy_pct", "dram_bw_util_pct", "sm_util_pct", "sm_occupancy_pct",
        "sm_clock_mhz", "mem_clock_mhz", "power_w", "mem_used_mib", "mem_total_mib")
_GPM_KEYS = ("dram_bw_util_pct", "sm_util_pct", "sm_occupancy_pct")


def _unavailable_reason(e: Exception) -> str:
    name = type(e).__name__
    if "LibraryNotFound" in name:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if "DriverNotLoaded" in name:
        return "NVML: the NVIDIA driver is not loaded"
    return f"NVML unavailable: {e}"


def _pci_key(bus_id: str | bytes) -> tuple[int, ...] | None:
    """`0000:65:00.0` (CUDA) and `00000000:65:00.0` (NVML) -> (0, 0x65, 0, 0), to compare them."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    try:
        domain, bus, rest = text.strip().rstrip("\0").split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def match_nvml_device(nv: Any, uuid: str | None = None, pci_bus_id: str | None = None) -> tuple[int, str]:
    """NVML's index of the GPU with this UUID (`GPU-...`), else this PCI bus id, and which one matched;
    LookupError when none does."""
    want_pci = _pci_key(pci_bus_id) if pci_bus_id else None
    found: dict[str, int] = {}
    for i in range(int(nv.nvmlDeviceGetCount())):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        got = _quiet(nv.nvmlDeviceGetUUID, h)
        got = got.decode() if isinstance(got, bytes) else got
        if uuid and got and got.lower() == uuid.lower():
            found.setdefault("uuid", i)
        pci = _quiet(nv.nvmlDeviceGetPciInfo, h)
        if want_pci and pci is not None and _pci_key(pci.busId) == want_pci:
            found.setdefault("pci_bus_id", i)
    for how in ("uuid", "pci_bus_id"):
        if how in found:
            return found[how], how
    raise LookupError(f"no GPU NVML sees has UUID {uuid} or PCI bus id {pci_bus_id}")


class NvmlSampler:
    """`NvmlSampler(index).sample()` -> {key: number | "n/a"}; `.available`, `.reason` say why not.

    With `uuid` or `pci_bus_id` (the torch/CUDA device's, see `CudaDevice.describe()`), the GPU
    is the one NVML lists with that UUID or bus id, whatever its NVML index.
    """

    def __init__(self, index: int = 0, *, uuid: str | None = None, pci_bus_id: str | None = None):
        self.index = index
        self.matched_by = "index"
        self.available = False
        self.reason = ""
        self.name = NA
        self.gpm = False
        self._nvml: Any = None
        self._handle: Any = None
        self._lock = threading.Lock()
        self._gpm_prev: Any = None  # (sample, time)
        self._gpm_spare: Any = None
        self._gpm_last: dict[str, Any] = dict.fromkeys(_GPM_KEYS, NA)
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed: pip install 'pdtop[gpu]'"
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:
            self.reason = _unavailable_reason(e)
            return
        try:
            if uuid or pci_bus_id:
                self.index, self.matched_by = match_nvml_device(pynvml, uuid, pci_bus_id)
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as e:
            self.reason = str(e) if isinstance(e, LookupError) else f"NVML has no GPU {index}: {e}"
            _quiet(pynvml.nvmlShutdown)
            return
        self._nvml = pynvml
        self.available = True
        name = _quiet(pynvml.nvmlDeviceGetName, self._handle)
        self.name = name.decode() if isinstance(name, bytes) else (name or NA)
        self._gpm_init()

    def _gpm_init(self) -> None:
        nv = self._nvml
        query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
        support = _quiet(query, self._handle) if query is not None else None
        if not support or not getattr(support, "isSupportedDevice", 0):
            return
        first, spare = _quiet(nv.nvmlGpmSampleAlloc), _quiet(nv.nvmlGpmSampleAlloc)
        if first is None or spare is None or _quiet(nv.nvmlGpmSampleGet, self._handle, first) is None:
            for s in (first, spare):
                if s is not None:
                    _quiet(nv.nvmlGpmSampleFree, s)
            return
        self.gpm = True
        self._gpm_prev, self._gpm_spare = (first, time.monotonic()), spare

    def describe(self) -> dict:
        return {"index": self.index, "name": self.name, "available": self.available,
                "reason": self.reason, "gpm": self.gpm, "matched_by": self.matched_by}

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(KEYS, NA)
        if not self.available:
            return out
        with self._lock:
            try:
                self._basic(out)
                if self.gpm:
                    out.update(self._gpm_sample())
            except Exception:  # never let telemetry crash the caller
                pass
        return out

    def _basic(self, out: dict[str, Any]) -> None:
        nv, h = self._nvml, self._handle
        util = _quiet(nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["gpu_util_pct"] = int(util.gpu)
            out["mem_busy_pct"] = int(util.memory)
        for key, clock in (("sm_clock_mhz", nv.NVML_CLOCK_SM), ("mem_clock_mhz", nv.NVML_CLOCK_MEM)):
            value = _quiet(nv.nvmlDeviceGetClockInfo, h, clock)
            if value is not None:
                out[key] = int(value)
        power = _quiet(nv.nvmlDeviceGetPowerUsage, h)  # milliwatts
        if power is not None:
            out["power_w"] = round(power / 1000.0, 1)
        mem = _quiet(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out["mem_used_mib"] = round(mem.used / 2**20)
            out["mem_total_mib"] = round(mem.total / 2**20)

    def _gpm_sample(self) -> dict[str, Any]:
        """GPM metrics between the kept sample and a new one, once they are >= 100 ms apart."""
        nv = self._nvml
        prev, t_prev = self._gpm_prev
        now = time.monotonic()
        if now - t_prev < GPM_MIN_INTERVAL_S:
            return self._gpm_last  # too soon: keep the older sample so the interval grows
        cur = self._gpm_spare
        if _quiet(nv.nvmlGpmSampleGet, self._handle, cur) is None:
            return dict.fromkeys(_GPM_KEYS, NA)
        ids = (nv.NVML_GPM_METRIC_DRAM_BW_UTIL, nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_SM_OCCUPANCY)
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        req.sample1, req.sample2 = prev, cur
        for i, metric in enumerate(ids):
            req.metrics[i].metricId = metric
        got: dict[str, float | str] = dict.fromkeys(_GPM_KEYS, NA)
        if _quiet(nv.nvmlGpmMetricsGet, req) is not None:
            for i, key in enumerate(_GPM_KEYS):
                m = req.metrics[i]
                if int(m.nvmlReturn) == nv.NVML_SUCCESS:
                    got[key] = round(float(m.value), 1)
        self._gpm_prev, self._gpm_spare = (cur, now), prev
        self._gpm_last = got
        return got

    def close(self) -> None:
        if not self.available:
            return
        with self._lock:
            nv = self._nvml
            for s in (self._gpm_prev[0] if self._gpm_prev else None, self._gpm_spare):
                if s is not None:
                    _quiet(nv.nvmlGpmSampleFree, s)
            self._gpm_prev = self._gpm_spare = None
            self.gpm = False
            self.available = False
            self.reason = "closed"
            _quiet(nv.nvmlShutdown)


def _quiet(fn: Any, *args: Any) -> Any:
    """fn(*args), or None if NVML says no (not supported, no permission, ...)."""
    try:
        return fn(*args)
    except Exception:
        return None
