"""The device interface: where decode and prefill work runs, and on how many units.

A level is an index into `groups`, a list of (prefill units, decode units) in
SGLang's stream-group order: 0 is "all to prefill", the last is "all to decode".
Work carries both its real computation (`run`) and its cost (FLOPs, bytes), so
a simulated device can time it on a virtual clock and telemetry can report
bytes moved for every device. `Work[R]` is work whose `run` returns R (the executor's:
decode `list[int]`, a prefill slice None, a chunked step `(list[int], int | None)`);
`run_decode` and `run_whole` hand that back typed, while prefill work goes in and comes
out of the device untyped (`object`), since the device only holds it until it is done.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pdtop.engine.description import DeviceDescription

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


@dataclass
class Work(Generic[R_co]):
    kind: str  # "decode" | "prefill" | "mixed"
    flops: float
    bytes: float
    run: Callable[[], R_co]  # the computation; on a simulated device, bookkeeping only


class Device(ABC):
    name: str
    kind: str  # "cpu" | "cuda" | "sim"
    unit_name: str  # "cores" | "SMs"
    units: int
    groups: list[tuple[int, int]]
    virtual: bool = False
    level: int = 0
    max_prefill_in_flight: int = 1  # prefill slices submit_prefill accepts before the first is done
    instances: int = 1  # 2 under disagg: prefill and decode as two instances (`set_instances`)

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def set_level(self, level: int) -> None:
        """Switch the split; waits for both sides to be idle first."""

    @abstractmethod
    def submit_prefill(self, work: Work[object]) -> None:
        """Start prefill work on the prefill side without waiting; at most `max_prefill_in_flight`
        outstanding, run in the order submitted."""

    @abstractmethod
    def prefill_busy(self) -> bool: ...

    def prefill_progress(self) -> float:
        """Fraction of the outstanding prefill work done (1.0 when none is outstanding). Devices that
        cannot tell say 0.0 until it is done, so its FLOPs and bytes count in the round it ends."""
        return 0.0 if self.prefill_busy() else 1.0

    @abstractmethod
    def wait_prefill(self) -> object:
        """Block (or advance the virtual clock) until the outstanding prefill is done; what its last
        slice's `run` returned (None when nothing was outstanding)."""

    def collect_prefill(self, in_flight: int, block: bool = False) -> int:
        """How many of the `in_flight` submitted prefill slices are done, oldest first, taking them;
        `block` waits for all of them. (One slice in flight: done when the prefill side is idle.)"""
        if in_flight and (block or not self.prefill_busy()):
            self.wait_prefill()
            return in_flight
        return 0

    @abstractmethod
    def run_decode(self, work: Work[R]) -> R:
        """Run decode work on the decode side and wait for it; what its `run` returned."""

    @abstractmethod
    def run_whole(self, work: Work[R]) -> R:
        """Run work on every unit and wait for it (chunked and prefill-first steps); what its `run` returned."""

    def set_groups(self, groups: list[tuple[int, int]]) -> list[tuple[int, int] | None]:
        """Replace the split levels (e.g. new manual divisions); called between rounds. Returns the
        units each level realized (None: the level could not be made and was dropped); `groups`
        becomes the realized levels. Here every level is realized as asked."""
        self.groups = list(groups)
        self.level = min(self.level, len(self.groups) - 1)
        return list(self.groups)

    def describe(self) -> DeviceDescription:
        """What every device says of itself; a device adds its own facts to `extra` (and `peak_bw`)."""
        return DeviceDescription(self.name, self.kind, self.unit_name, self.units)

    @abstractmethod
    def close(self) -> None:
        """Release the threads, streams or contexts the device holds."""

    @property
    def split(self) -> tuple[int, int]:
        if self.instances == 2 and self.virtual:
            return self.units, self.units  # two simulated GPUs, each whole
        return self.groups[self.level]

    def set_instances(self, n: int) -> None:
        """1: one instance, split by levels; 2 (disagg): a prefill instance and a decode instance. A
        simulated device then simulates two whole GPUs (each its own SMs and bandwidth); real
        devices keep the level's two disjoint unit sets, which the scheduler picks."""
        self.instances = n

    def pin_to_side(self, side: int) -> None:
        """Run the calling thread (a helper's, such as disagg's KV copy) on the units of prefill
        (side 0) or decode (1) at the current level: on the CPU its cores; elsewhere nothing to do."""
        return

    def prefill_ended(self) -> float:
        """When the prefill just collected ended (the clock now, where the device cannot tell)."""
        return self.now()

    def idle(self, seconds: float) -> None:
        """Nothing to run: let time pass (a simulated device advances its clock)."""
        time.sleep(seconds)
