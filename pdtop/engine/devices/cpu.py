"""CPU cores play the SMs: prefill and decode run on two threads pinned to disjoint cores.

Level rule (`splits.cpu_groups`): cores are units with granularity 1, decode gets
at least one core and prefill at least half, plus "all to prefill" and "all to
decode"; on 2 cores the levels are 2/0, 1/1, 0/2. Prefill takes the first cores
of the affinity mask, decode the last. A side with no cores at the current level
that still has work runs on every core (time-shared, not isolated).

Each worker thread sets its own affinity (`os.sched_setaffinity` on its native
thread id) and its own torch thread count (per calling thread with torch's
OpenMP backend) before each job whose core set changed, then pins its OpenMP team
threads to the same cores (`cpu_kernels.pin_team`): they keep the affinity they were
created with, which after a level change may be the other side's cores.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pdtop.engine.description import DeviceDescription
from pdtop.engine.devices.base import Device, R, Work


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask)."""
    return sorted(os.sched_getaffinity(0))


class _SideWorker:
    """One thread that runs jobs on a given core set."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pdtop-{name}")
        self._applied: tuple[int, ...] | None = None
        self.native_id: int | None = None

    def submit(self, cores: tuple[int, ...], fn: Callable[[], R]) -> Future[R]:
        def job() -> R:
            if cores != self._applied:
                import torch

                from pdtop.engine.model import cpu_kernels

                self.native_id = threading.get_native_id()
                os.sched_setaffinity(self.native_id, cores)
                torch.set_num_threads(len(cores))
                cpu_kernels.pin_team(cores)
                self._applied = cores
            return fn()

        return self._pool.submit(job)

    @property
    def cores(self) -> tuple[int, ...] | None:
        return self._applied

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class CpuDevice(Device):
    kind = "cpu"
    unit_name = "cores"
    virtual = False

    def __init__(self, groups: list[tuple[int, int]], cores: list[int] | None = None):
        self.cores = tuple(sorted(cores)) if cores is not None else tuple(usable_cores())
        self.units = len(self.cores)
        self.name = f"cpu ({self.units} cores)"
        self.groups = list(groups)
        self.level = 0
        self._prefill = _SideWorker("prefill")
        self._decode = _SideWorker("decode")
        self._pending: Future[object] | None = None

    def describe(self) -> DeviceDescription:
        out = super().describe()
        out.extra["cores"] = list(self.cores)
        return out

    def now(self) -> float:
        return time.perf_counter()

    def side_cores(self, side: int) -> tuple[int, ...]:
        """Cores of prefill (side 0) or decode (side 1) at the current level."""
        p, d = self.groups[self.level]
        if side == 0:
            return self.cores[:p] if p else self.cores
        return self.cores[self.units - d:] if d else self.cores

    def set_level(self, level: int) -> None:
        if not 0 <= level < len(self.groups):
            raise ValueError(f"level {level} out of range 0..{len(self.groups) - 1}")
        self.wait_prefill()
        self.level = level

    def submit_prefill(self, work: Work[object]) -> None:
        if self._pending is not None and not self._pending.done():
            raise RuntimeError("a prefill is already outstanding")
        self._pending = self._prefill.submit(self.side_cores(0), work.run)

    def prefill_busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def wait_prefill(self) -> object:
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def run_decode(self, work: Work[R]) -> R:
        return self._decode.submit(self.side_cores(1), work.run).result()

    def run_whole(self, work: Work[R]) -> R:
        self.wait_prefill()
        return self._decode.submit(self.cores, work.run).result()

    def pin_to_side(self, side: int) -> None:
        import torch

        cores = self.side_cores(side)
        os.sched_setaffinity(threading.get_native_id(), cores)
        torch.set_num_threads(len(cores))

    def worker_cores(self) -> dict[str, tuple[int, ...] | None]:
        """The core sets the two threads last pinned themselves to (for tests and telemetry)."""
        return {"prefill": self._prefill.cores, "decode": self._decode.cores}

    def close(self) -> None:
        self._prefill.close()
        self._decode.close()
