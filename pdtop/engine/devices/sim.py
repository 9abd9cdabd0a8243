"""A simulated GPU on a virtual clock, timed with the seed's roofline.

Decode work takes max(FLOPs at its SMs' share of compute, bytes at bandwidth
scaled by min(1, SMs / S_SAT)); prefill work takes its FLOPs at its SMs' share
of compute (and never less than its bytes at full bandwidth). Work still runs
(`work.run()`), but on the simulated device it only does bookkeeping, so the
same scheduler drives it much faster than real time and deterministically.
"""
from __future__ import annotations

from typing import Any

from pdtop.engine.devices.base import Device, Work
from pdtop.engine.roofline.cost import decode_time, memory_time, prefill_time
from pdtop.engine.roofline.gpu_specs import GpuSpec, parse_gpu


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
        self._prefill_free_at = 0.0
        self._prefill_result: Any = None

    def describe(self) -> dict:
        s = self.spec
        return {**super().describe(), "cc": f"{s.cc_major}.{s.cc_minor}", "peak_bw": s.mem_bw,
                "peak_flops": s.peak_flops, "s_sat": s.s_sat}

    def now(self) -> float:
        return self.clock

    def _side_units(self, side: int) -> int:
        units = self.groups[self.level][side]
        return units if units > 0 else self.units  # an empty side's work time-shares the other side

    def decode_seconds(self, work: Work, sms: int) -> float:
        """Memory-bound on `sms` SMs, unless its FLOPs (at prefill's MFU) take longer."""
        return max(prefill_time(self.spec, work.flops, sms), decode_time(self.spec, work.bytes, sms))

    def prefill_seconds(self, work: Work, sms: int) -> float:
        return max(prefill_time(self.spec, work.flops, sms), memory_time(self.spec, work.bytes))

    def idle(self, seconds: float) -> None:
        self.clock += seconds

    def set_level(self, level: int) -> None:
        self.wait_prefill()
        self.level = level

    def submit_prefill(self, work: Work) -> None:
        start = max(self.clock, self._prefill_free_at)
        self._prefill_free_at = start + self.prefill_seconds(work, self._side_units(0))
        self._prefill_result = work.run()

    def prefill_busy(self) -> bool:
        return self.clock < self._prefill_free_at

    def wait_prefill(self) -> Any:
        self.clock = max(self.clock, self._prefill_free_at)
        result, self._prefill_result = self._prefill_result, None
        return result

    def run_decode(self, work: Work) -> Any:
        self.clock += self.decode_seconds(work, self._side_units(1))
        return work.run()

    def run_whole(self, work: Work) -> Any:
        self.wait_prefill()
        if work.kind == "decode":
            self.clock += self.decode_seconds(work, self.units)
        else:  # the seed's chunked step: compute of everything at full SMs, or its bytes if longer
            self.clock += self.prefill_seconds(work, self.units)
        return work.run()

    def close(self) -> None:
        """Nothing to release: no threads, no kernels."""
