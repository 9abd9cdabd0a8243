"""A simulated GPU on a virtual clock, timed with the seed's roofline (`pdtop.engine.roofline`).

Alone on its side, decode work takes max(FLOPs at its SMs' share of compute, bytes at
bandwidth scaled by min(1, SMs / S_SAT)); prefill work takes its FLOPs at its SMs' share
of compute (and never less than its bytes at full bandwidth). When both sides run, they
share the memory bandwidth (`roofline.sharing`): each progresses at the rate its granted
bandwidth allows, so together they never stream more than the device achieves. A side
with no SMs (a whole-device level pinned while both sides have work) time-shares the
other side's SMs: while both run, each goes at half speed.

An overlapped level (`overlap_decode_full_sm`: `(p, all SMs)`) runs decode on the whole device
at high priority beside a prefill capped at `p` SMs: while both run, decode takes the SMs it
needs to go as fast as on the whole device (`decode_sms`), its own `total - p` first, and the
prefill runs on what that leaves of its `p` (at least one); both still share the bandwidth.

Work still runs (`work.run()`), but on the simulated device it only does bookkeeping, so
the same scheduler drives it much faster than real time and deterministically.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pdtop.engine.description import DeviceDescription
from pdtop.engine.devices.base import Device, R, Work
from pdtop.engine.roofline.cost import achieved_bandwidth, decode_time, memory_time, prefill_time
from pdtop.engine.roofline.gpu_specs import GpuSpec, parse_gpu
from pdtop.engine.roofline.sharing import share_bandwidth


@dataclass
class _Running:
    """Work in flight on one side: the seconds it takes alone on its SMs, and the fraction left."""

    work: Work[object]
    alone_s: float
    left: float = 1.0
    beside_s: float | None = None  # an overlapped level's prefill: its time on the SMs decode leaves it

    def __post_init__(self) -> None:
        if self.alone_s <= 0:  # no FLOPs, no bytes: done at once
            self.left = 0.0

    def pace(self, beside: bool) -> float:
        """Seconds the whole work takes at its current speed (`beside`: the other side runs too)."""
        return self.beside_s if beside and self.beside_s is not None else self.alone_s

    def demand(self, beside: bool = False) -> float:
        """Bytes/s it streams when the bandwidth is not short."""
        pace = self.pace(beside)
        return self.work.bytes / pace if pace > 0 else 0.0

    def rate(self, granted: float, beside: bool = False) -> float:
        """Fraction of the work done per second with `granted` bytes/s."""
        if self.work.bytes <= 0 or granted >= self.demand(beside):
            return 1.0 / self.pace(beside)
        return granted / self.work.bytes


class SimDevice(Device):
    kind = "sim"
    unit_name = "SMs"
    virtual = True

    def __init__(self, spec: GpuSpec | str, groups: list[tuple[int, int]]):
        self.spec = parse_gpu(spec) if isinstance(spec, str) else spec
        self.name = f"sim:{self.spec.name}"
        self.units = self.spec.sms
        self.groups = list(groups)
        self.level = 0
        self.clock = 0.0
        self._bandwidth = achieved_bandwidth(self.spec)
        self._prefill: _Running | None = None
        self._prefill_result: object = None
        self._prefill_end = 0.0  # the clock when the last prefill ended

    def describe(self) -> DeviceDescription:
        s, out = self.spec, super().describe()
        out.peak_bw = s.mem_bw
        out.extra.update({"cc": f"{s.cc_major}.{s.cc_minor}", "peak_flops": s.peak_flops, "s_sat": s.s_sat})
        return out

    def now(self) -> float:
        return self.clock

    def _side_units(self, side: int) -> int:
        if self.instances == 2:
            return self.units  # each instance is a whole GPU of its own
        units = self.groups[self.level][side]
        return units if units > 0 else self.units  # an empty side's work time-shares the other side

    def decode_seconds(self, work: Work[object], sms: int) -> float:
        """Alone: memory-bound on `sms` SMs, unless its FLOPs (at prefill's MFU) take longer."""
        return max(prefill_time(self.spec, work.flops, sms), decode_time(self.spec, work.bytes, sms))

    def prefill_seconds(self, work: Work[object], sms: int) -> float:
        """Alone: its FLOPs on `sms` SMs, or its bytes at the whole GPU's bandwidth if that is longer."""
        return max(prefill_time(self.spec, work.flops, sms), memory_time(self.spec, work.bytes))

    def _advance(self, job: _Running | None, deadline: float = math.inf) -> None:
        """Move the clock on, running `job` beside the prefill in flight, until `job` is done
        (without a job: until the prefill is done) or the clock reaches `deadline`."""
        goal = job if job is not None else self._prefill
        while goal is not None and goal.left > 0 and self.clock < deadline:
            self._run_for([j for j in (job, self._prefill) if j is not None and j.left > 0], deadline)
        if deadline < math.inf:
            self.clock = max(self.clock, deadline)

    def _run_for(self, running: list[_Running], deadline: float) -> None:
        """Run `running` (one or both sides, sharing bandwidth; half speed each on a time-shared
        level) until the first of them ends or the clock reaches `deadline`."""
        beside = len(running) == 2 and self.instances != 2  # two GPUs: nothing runs beside on one device
        if self.instances == 2:  # two GPUs: each its own bandwidth, nothing shared
            grants, slow = [j.demand() for j in running], 1.0
        else:
            grants = share_bandwidth(self._bandwidth, [j.demand(beside) for j in running])
            slow = 0.5 if 0 in self.groups[self.level] and beside else 1.0
        rates = [j.rate(g, beside) * slow for j, g in zip(running, grants, strict=True)]
        dt = min(deadline - self.clock, *(j.left / r for j, r in zip(running, rates, strict=True)))
        for j, r in zip(running, rates, strict=True):
            j.left = 0.0 if j.left / r <= dt else j.left - r * dt
            if j is self._prefill and j.left == 0.0:
                self._prefill_end = self.clock + dt
        self.clock += dt

    def idle(self, seconds: float) -> None:
        self._advance(None, self.clock + seconds)

    def set_level(self, level: int) -> None:
        self.wait_prefill()
        self.level = level

    def submit_prefill(self, work: Work[object]) -> None:
        if self.prefill_busy():
            raise RuntimeError("a prefill is already outstanding")
        self._prefill = _Running(work, self.prefill_seconds(work, self._side_units(0)))
        if self._prefill.left == 0.0:  # nothing to do: done as it starts
            self._prefill_end = self.clock
        self._prefill_result = work.run()

    def prefill_ended(self) -> float:
        return self._prefill_end

    def prefill_busy(self) -> bool:
        return self._prefill is not None and self._prefill.left > 0

    def prefill_progress(self) -> float:
        return 1.0 - self._prefill.left if self._prefill is not None else 1.0

    def wait_prefill(self) -> object:
        self._advance(None)
        self._prefill = None
        result, self._prefill_result = self._prefill_result, None
        return result

    def decode_sms(self, work: Work[object]) -> int:
        """The fewest SMs on which `work` decodes as fast as on the whole device (a high-priority decode
        stream takes no more): S_SAT for memory-bound steps, more when the FLOPs dominate."""
        full, lo, hi = self.decode_seconds(work, self.units), 1, self.units
        while lo < hi:  # decode_seconds never grows with more SMs
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.decode_seconds(work, mid) <= full * (1 + 1e-9) else (mid + 1, hi)
        return lo

    def run_decode(self, work: Work[R]) -> R:
        p, d = self.groups[self.level]
        if self._prefill is not None and p + d > self.units:  # overlapped: decode takes SMs off the prefill
            taken = max(0, self.decode_sms(work) - (self.units - p))
            self._prefill.beside_s = self.prefill_seconds(self._prefill.work, max(1, p - taken))
        self._advance(_Running(work, self.decode_seconds(work, self._side_units(1))))
        return work.run()

    def run_whole(self, work: Work[R]) -> R:
        self.wait_prefill()
        if work.kind == "decode":
            self.clock += self.decode_seconds(work, self.units)
        else:  # the seed's chunked step: compute of everything at full SMs, or its bytes if longer
            self.clock += self.prefill_seconds(work, self.units)
        return work.run()

    def close(self) -> None:
        """Nothing to release: no threads, no kernels."""
