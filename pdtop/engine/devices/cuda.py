"""NVIDIA GPU device: prefill and decode on disjoint SMs through CUDA green contexts.

Levels are SGLang's stream groups (`splits.stream_groups`): each middle level is one
green-context pair (`green_ctx.GreenContexts.split`) whose two raw streams torch uses
through `torch.cuda.ExternalStream`; the two end levels ("all to prefill", "all to
decode") use plain torch streams on the whole device. Kernels launch asynchronously,
so `submit_prefill` returns as soon as the prefill kernels are queued and decode runs
on its own SMs meanwhile (docs/gpu.md). Green contexts isolate SMs only: memory
bandwidth and L2 stay shared.

Work.run() rules on this device: it runs with the side's stream current, so tensors
it makes belong to that stream; a prefill's run() must not synchronize (no .item(),
.tolist(), .cpu()), or submit_prefill blocks until the prefill is done.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pdtop.engine.devices.base import Device, Work
from pdtop.engine.devices.green_ctx import INSTALL_HINT, GreenContexts, GreenPair
from pdtop.engine.errors import DeviceError


def cuda_unavailable_reason(index: int = 0) -> str | None:
    """Why the CUDA device cannot start here (everything missing, on one line), or None."""
    missing: list[str] = []
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        try:
            from cuda import cuda as _old  # noqa: F401
        except ImportError:
            missing.append(f"cuda-python is not installed ({INSTALL_HINT})")
    try:
        import torch
    except ImportError:
        return "; ".join([*missing, "torch is not installed"])
    if torch.version.cuda is None:
        missing.append(f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)")
    elif not torch.cuda.is_available():
        missing.append(f"torch {torch.__version__} sees no CUDA GPU (no NVIDIA driver or GPU visible)")
    elif not 0 <= index < torch.cuda.device_count():
        missing.append(f"CUDA device index {index} out of range: {torch.cuda.device_count()} GPU(s) visible")
    return "; ".join(missing) or None


def cuda_device_info(index: int = 0) -> dict:
    """Name, SM count and compute capability of GPU `index` through torch, for building a split
    table before the device; `DeviceError` (what is missing) where there is no usable GPU."""
    reason = cuda_unavailable_reason(index)
    if reason:
        raise DeviceError(f"cuda device unavailable: {reason}")
    import torch

    p = torch.cuda.get_device_properties(index)
    return {"name": p.name, "sms": p.multi_processor_count, "major": p.major, "minor": p.minor}


@dataclass
class _Level:
    """The two streams one level runs on; `pair` is None for the whole-device end levels."""

    prefill: Any  # torch.cuda.Stream | torch.cuda.ExternalStream
    decode: Any
    pair: GreenPair | None
    realized: tuple[int, int]


@dataclass
class _Pending:
    work: Work  # held so tensors its closure captured stay alive until the kernels finish
    result: Any
    event: Any  # torch.cuda.Event recorded after the prefill's kernels


class CudaDevice(Device):
    kind = "cuda"
    unit_name = "SMs"
    virtual = False

    def __init__(self, groups: list[tuple[int, int]] | None = None, index: int = 0, sm_group_num: int = 8,
                 balanced_workqueues: bool = False):
        """`groups=None` builds SGLang's `stream_groups`; `balanced_workqueues` needs a CUDA 13.1+ driver."""
        reason = cuda_unavailable_reason(index)
        if reason:
            raise DeviceError(f"cuda device unavailable: {reason}")
        import torch

        self._torch = torch
        self.tdev = torch.device("cuda", index)
        torch.empty(1, device=self.tdev)  # make torch's primary context before the green contexts retain it
        self.gc = GreenContexts(index)
        self.name = f"cuda:{index}"
        self.units = self.gc.total_sms
        self.cc_major, self.cc_minor = self.gc.major, self.gc.minor
        self._whole_prefill = torch.cuda.Stream(self.tdev)  # torch's pool streams are non-blocking
        self._whole_decode = torch.cuda.Stream(self.tdev)
        self._whole = torch.cuda.Stream(self.tdev)
        self._levels: dict[tuple[int, int], _Level] = {}
        self._pending: _Pending | None = None
        self._closed = False
        self.balanced_workqueues = balanced_workqueues
        self.groups = []
        self.level = 0
        if groups is None:
            from pdtop.engine.scheduling.splits import stream_groups

            groups = stream_groups(self.units, self.cc_major, sm_group_num)
        try:
            self.set_groups(groups)
        except BaseException:
            self.gc.close()
            raise

    # -- levels ------------------------------------------------------------------------------
    def _make_level(self, group: tuple[int, int]) -> _Level:
        p, d = group
        if p < 0 or d < 0 or p + d > self.units or p + d == 0:
            raise DeviceError(f"level {group} does not fit {self.name} ({self.units} SMs)")
        if p == 0 or d == 0:
            return _Level(self._whole_prefill, self._whole_decode, None, (p, d))
        pair = self.gc.split(p, d, self.balanced_workqueues)
        ext = self._torch.cuda.ExternalStream
        return _Level(ext(pair.prefill_stream, device=self.tdev), ext(pair.decode_stream, device=self.tdev),
                      pair, pair.realized)

    def set_groups(self, groups: list[tuple[int, int]]) -> None:
        """Build green contexts for new levels, destroy those no longer used; keeps the old set on failure."""
        wanted = [(int(p), int(d)) for p, d in groups]
        if len(wanted) < 2:
            raise DeviceError(f"a split table needs at least 2 levels, got {wanted}")
        self._sync_all()
        made: dict[tuple[int, int], _Level] = {}
        try:
            for g in wanted:
                if g not in made:
                    made[g] = self._levels[g] if g in self._levels else self._make_level(g)
        except BaseException:
            for g, lvl in made.items():
                if g not in self._levels and lvl.pair is not None:
                    self.gc.destroy(lvl.pair)
            raise
        for g, lvl in self._levels.items():
            if g not in made and lvl.pair is not None:
                self.gc.destroy(lvl.pair)
        self._levels = made
        super().set_groups(wanted)

    @property
    def realized(self) -> list[tuple[int, int]]:
        """SMs the driver gave each level (>= the request; equal on the GPUs seen so far)."""
        return [self._levels[g].realized for g in self.groups]

    def _current(self) -> _Level:
        return self._levels[self.groups[self.level]]

    def set_level(self, level: int) -> None:
        if not 0 <= level < len(self.groups):
            raise ValueError(f"level {level} out of range 0..{len(self.groups) - 1}")
        if level != self.level:
            cur = self._current()
            cur.prefill.synchronize()
            cur.decode.synchronize()
            self.level = level

    # -- work --------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()

    def _launch(self, stream: Any, work: Work) -> Any:
        torch = self._torch
        stream.wait_stream(torch.cuda.current_stream(self.tdev))  # inputs made on the caller's stream
        with torch.cuda.stream(stream):
            return work.run()

    def submit_prefill(self, work: Work) -> None:
        if self.prefill_busy():
            raise RuntimeError("a prefill is already outstanding")
        stream = self._current().prefill
        result = self._launch(stream, work)
        event = self._torch.cuda.Event()
        event.record(stream)
        self._pending = _Pending(work, result, event)

    def prefill_busy(self) -> bool:
        return self._pending is not None and not self._pending.event.query()

    def wait_prefill(self) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        pending.event.synchronize()
        return pending.result

    def run_decode(self, work: Work) -> Any:
        stream = self._current().decode
        out = self._launch(stream, work)
        stream.synchronize()
        return out

    def run_whole(self, work: Work) -> Any:
        out = self._launch(self._whole, work)
        self._whole.synchronize()
        return out

    # -- the rest ----------------------------------------------------------------------------
    def describe(self) -> dict:
        return {**super().describe(), **{k: v for k, v in self.gc.describe().items() if k != "name"},
                "gpu": self.gc.name, "levels_realized": [list(r) for r in self.realized],
                "balanced_workqueues": self.balanced_workqueues}

    def _sync_all(self) -> None:
        streams = [self._whole, self._whole_prefill, self._whole_decode]
        for lvl in self._levels.values():
            streams += [lvl.prefill, lvl.decode]
        for s in streams:
            s.synchronize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sync_all()
        finally:
            self._levels.clear()
            self._pending = None
            self.gc.close()
