"""Hardware sampler: a daemon thread that publishes an `hw` event about once a second.

Host metrics come from psutil. GPU metrics come from `pdtop.telemetry.hardware.nvml_sampler`
(`NvmlSampler`): its keys are always present, "n/a" where NVML, the driver or the
device lacks them, with `gpu_reason` saying why. Nothing here stops the sampler.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from pdtop.quiet_log import QuietLog
from pdtop.telemetry.events import Hw
from pdtop.telemetry.hardware.nvml_sampler import NvmlSampler

log = logging.getLogger("pdtop.telemetry.hardware.hw")


def host_metrics() -> dict[str, Any]:
    """CPU % per core since the previous call, and host memory in bytes."""
    mem = psutil.virtual_memory()
    return {
        "cpu_percent": psutil.cpu_percent(percpu=True),
        "host_mem_used_bytes": mem.total - mem.available,
        "host_mem_total_bytes": mem.total,
        "host_mem_percent": mem.percent,
    }


def _nvml_sampler(match: dict[str, Any] | None) -> NvmlSampler | None:
    try:
        return NvmlSampler(**(match or {}))
    except Exception as exc:  # a broken driver must not stop telemetry
        log.info("NVML unavailable: %s", exc)
        return None


class HwSampler:
    """Calls `publish(event)` every `interval` seconds until `stop()`."""

    def __init__(self, publish: Callable[[Hw], None], interval: float = 1.0, *,
                 gpu: bool = True, gpu_match: dict[str, Any] | None = None) -> None:
        """`gpu_match`: the engine's GPU as {"uuid": ..., "pci_bus_id": ...} (else NVML's GPU 0)."""
        self.publish = publish
        self.interval = interval
        self._gpu = _nvml_sampler(gpu_match) if gpu else None
        self._stop = threading.Event()
        self._quiet = QuietLog(log)  # a failure that repeats every second (out of files) is logged once
        self._thread = threading.Thread(target=self._loop, name="pdtop-hw-sampler", daemon=True)

    @property
    def gpu_available(self) -> bool:
        return self._gpu is not None and self._gpu.available

    def sample(self) -> Hw:
        metrics = host_metrics()
        if self._gpu is not None:
            try:
                metrics.update(self._gpu.sample(), gpu_name=self._gpu.name, gpu_reason=self._gpu.reason)
            except Exception as exc:
                log.debug("NVML sample failed: %s", exc)
        return Hw(time.time(), **metrics)

    def start(self) -> HwSampler:
        psutil.cpu_percent(percpu=True)  # prime: the first reading is against this one
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval + 1)
        if self._gpu is not None:
            self._gpu.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish(self.sample())
            except Exception as exc:
                self._quiet.warning("hw sample", "hw sample failed: %r", exc)
