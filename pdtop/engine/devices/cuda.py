"""NVIDIA GPU device: prefill and decode on disjoint SMs through CUDA green contexts.

Levels are SGLang's stream groups (`roofline.partition.stream_groups`): each middle level is one
green-context pair (`green_ctx.GreenContexts.acquire`) whose two raw streams torch uses
through `torch.cuda.ExternalStream`; the two end levels ("all to prefill", "all to
decode") use plain torch streams on the whole device. Kernels launch asynchronously,
so `submit_prefill` returns as soon as the prefill kernels are queued and decode runs
on its own SMs meanwhile (docs/gpu.md). Green contexts isolate SMs only: memory
bandwidth and L2 stay shared. A device's levels come from the process's `green_ctx.shared`
contexts and go back there, never destroyed: tensors used on their streams may outlive the device
(`green_ctx`'s docstring). An overlapped level (`overlap_decode_full_sm`, `(p, all SMs)`)
is SGLang's: prefill on the first half of a `(p, total - p)` green-context pair (the other
half is kept, unused), decode on a plain whole-device stream at high priority.

Work.run() rules on this device: it runs with the side's stream current, so tensors
it makes belong to that stream; a prefill's run() must not synchronize (no .item(),
.tolist(), .cpu()), or submit_prefill blocks until the prefill is done.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pdtop.engine.description import DeviceDescription
from pdtop.engine.devices.base import Device, R, Work
from pdtop.engine.devices.cuda_setup import cuda_unavailable_reason, max_connections_state, set_max_connections
from pdtop.engine.devices.green_ctx import GreenContexts, GreenPair, shared
from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import overlaps, stream_groups

if TYPE_CHECKING:  # torch is imported when a device is made (`cuda_unavailable_reason` first says why it cannot)
    import torch

log = logging.getLogger(__name__)
PREFILL_SLICES_IN_FLIGHT = 2
OVERLAP_DECODE_PRIORITY = -1  # torch: lower is sooner; SGLang's overlapped decode stream uses -1


@dataclass
class _Level:
    """The two streams one level runs on; `pair` is None for the whole-device end levels."""

    requested: tuple[int, int]
    realized: tuple[int, int]
    prefill: torch.cuda.Stream  # a torch.cuda.ExternalStream on a green context's raw stream, for a split level
    decode: torch.cuda.Stream
    pair: GreenPair | None


@dataclass
class _Pending:
    work: Work[object]  # held so tensors its closure captured stay alive until the kernels finish
    result: object
    event: torch.cuda.Event  # recorded after the prefill's kernels


StreamsListener = Callable[[dict[int, "torch.cuda.Stream"]], None]


class CudaDevice(Device):
    kind = "cuda"
    unit_name = "SMs"
    virtual = False
    max_prefill_in_flight = PREFILL_SLICES_IN_FLIGHT

    def __init__(self, groups: list[tuple[int, int]] | None = None, index: int = 0, sm_group_num: int = 8,
                 balanced_workqueues: bool = False):
        """`groups=None` builds SGLang's `stream_groups`; `balanced_workqueues` needs a CUDA 13.1+ driver."""
        set_max_connections()
        reason = cuda_unavailable_reason(index)
        if reason:
            raise DeviceError(f"cuda device unavailable: {reason}")
        import torch

        tdev = torch.device("cuda", index)
        torch.empty(1, device=tdev)  # make torch's primary context before the green contexts retain it
        self._start(torch, tdev, shared(index), groups, sm_group_num, balanced_workqueues)

    def _start(self, torch: Any, tdev: Any, gc: GreenContexts, groups: list[tuple[int, int]] | None,
               sm_group_num: int, balanced_workqueues: bool) -> None:
        """The device on `gc`'s GPU (a test passes a fake driver's and a stand-in for torch's streams)."""
        self._torch, self.tdev, self.gc = torch, tdev, gc
        self.name = f"cuda:{gc.index}"
        self.units = self.gc.total_sms
        self.cc_major, self.cc_minor = self.gc.major, self.gc.minor
        self._whole_prefill = torch.cuda.Stream(self.tdev)  # torch's pool streams are non-blocking
        self._whole_decode = torch.cuda.Stream(self.tdev)
        self._whole = torch.cuda.Stream(self.tdev)
        self._made: dict[tuple[int, int], _Level] = {}  # by requested group
        self._active: list[_Level] = []  # one per level, in level order
        self.wanted: list[tuple[int, int]] = []  # the table as last requested, dropped levels included
        self.dropped: list[tuple[tuple[int, int], str]] = []
        self._pending: deque[_Pending] = deque()
        self._listeners: list[StreamsListener] = []
        self._closed = False
        self.balanced_workqueues = balanced_workqueues
        self.groups = []
        self.level = 0
        if groups is None:
            groups = stream_groups(self.units, self.cc_major, sm_group_num)
        self.set_groups(groups)

    # -- levels ------------------------------------------------------------------------------
    def _make_level(self, group: tuple[int, int]) -> _Level:
        p, d = group
        if overlaps(group, self.units) and d == self.units and 0 < p < self.units:
            return self._make_overlapped(group)
        if p < 0 or d < 0 or p + d > self.units or p + d == 0:
            raise DeviceError(f"does not fit {self.name} ({self.units} SMs)")
        if p == 0 or d == 0:
            return _Level(group, (self.units if p else 0, self.units if d else 0),
                          self._whole_prefill, self._whole_decode, None)
        pair = self.gc.acquire(p, d, self.balanced_workqueues)
        ext = self._torch.cuda.ExternalStream
        return _Level(group, pair.realized, ext(pair.prefill_stream, device=self.tdev),
                      ext(pair.decode_stream, device=self.tdev), pair)

    def _make_overlapped(self, group: tuple[int, int]) -> _Level:
        """SGLang's overlapped level: the prefill green context of a `(p, total - p)` pair (its decode
        half reserved, unused), and decode on a plain stream of the whole device at high priority."""
        pair = self.gc.acquire(group[0], self.units - group[0], self.balanced_workqueues)
        torch = self._torch
        prefill = torch.cuda.ExternalStream(pair.prefill_stream, device=self.tdev)
        decode = torch.cuda.Stream(self.tdev, priority=OVERLAP_DECODE_PRIORITY)
        return _Level(group, (pair.realized[0], self.units), prefill, decode, pair)

    def set_groups(self, groups: list[tuple[int, int]]) -> list[tuple[int, int] | None]:
        """Carve each split level (`GreenContexts.acquire`); a level the driver cannot make is dropped
        with a one-line warning naming it (`dropped`, with the driver's reason; `wanted` keeps the
        whole table as requested). Levels no longer used go back to the process's pool
        (`retire_levels`); the device's `groups` become the realized counts of the levels kept."""
        wanted = [(int(p), int(d)) for p, d in groups]
        if len(wanted) < 2:
            raise DeviceError(f"a split table needs at least 2 levels, got {wanted}")
        self._sync_all()
        made: dict[tuple[int, int], _Level] = {}
        try:
            made, dropped = make_levels(wanted, self._make_level, self._made)
            active = [made[g] for g in wanted if g in made]
            if len(active) < 2:
                raise DeviceError(f"no usable split table on {self.name}: {'; '.join(r for _, r in dropped)}")
        except BaseException:  # nothing changes: the levels just taken go back
            for g, lvl in made.items():
                if g not in self._made and lvl.pair is not None:
                    self.gc.release(lvl.pair)
            raise
        gone = [lvl.pair for g, lvl in self._made.items() if g not in made and lvl.pair is not None]
        # e.g. CUDA graphs: captured for new streams, freed for old ones before those are given back
        retire_levels(self.gc, gone, self._listeners, _decode_streams(active, self._whole), self._synchronize)
        self._made, self._active, self.wanted, self.dropped = made, active, wanted, dropped
        super().set_groups([lvl.realized for lvl in active])
        return [made[g].realized if g in made else None for g in wanted]

    def add_streams_listener(self, listener: StreamsListener) -> None:
        """Call `listener({handle: stream})` with every decode stream now and whenever the levels change."""
        self._listeners.append(listener)
        listener(_decode_streams(self._active, self._whole))

    @property
    def realized(self) -> list[tuple[int, int]]:
        """SMs each level's green contexts hold (what runs; equal to `groups`)."""
        return [lvl.realized for lvl in self._active]

    def carves(self) -> list[dict[str, Any] | None]:
        """Per level, its first carve (`outer_sms` and `outer_limits`: what the `p + d` context holds)
        or why it was not made (`note`); None for the whole-device end levels, which are not carved."""
        return [None if lvl.pair is None else carve_record(lvl.pair) for lvl in self._active]

    def measure_sms(self, time_limit_s: float = 5.0, **probe: Any) -> list[dict[str, Any] | None]:
        """Per level, the SMs its two streams' kernels were seen running on (`sm_probe`: distinct
        `%smid` and a compute-bound kernel's time against the whole device), beside `realized`
        (the driver's own count). A side with no SMs is None; see `sm_probe.measure_levels`.
        `probe` goes to `SmProbe` (a test's stand-in NVRTC and clock)."""
        from pdtop.engine.devices.sm_probe import SmProbe, measure_levels

        self._sync_all()
        handles = [(int(lvl.prefill.cuda_stream) if lvl.realized[0] else None,
                    int(lvl.decode.cuda_stream) if lvl.realized[1] else None) for lvl in self._active]
        sm_probe = SmProbe(self.gc, **probe)
        try:
            return measure_levels(sm_probe, handles, time_limit_s)
        finally:
            sm_probe.close()

    @property
    def requested(self) -> list[tuple[int, int]]:
        """What each running level asked for (`wanted` is the whole table, dropped levels too)."""
        return [lvl.requested for lvl in self._active]

    def _current(self) -> _Level:
        return self._active[self.level]

    def side_streams(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        """The current level's (prefill, decode) streams, for timing work on them (bench/gpu_check.py)."""
        lvl = self._current()
        return lvl.prefill, lvl.decode

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

    def _launch(self, stream: torch.cuda.Stream, work: Work[R]) -> R:
        torch = self._torch
        stream.wait_stream(torch.cuda.current_stream(self.tdev))  # inputs made on the caller's stream
        with torch.cuda.stream(stream):
            return work.run()

    def submit_prefill(self, work: Work[object]) -> None:
        """Queue a prefill slice behind those in flight on the prefill stream (at most
        `max_prefill_in_flight`, as SGLang launches a slice every round without waiting)."""
        running = sum(1 for p in self._pending if not p.event.query())  # done ones wait to be collected
        if running >= self.max_prefill_in_flight:
            raise RuntimeError(f"{running} prefill slices are already in flight")
        stream = self._current().prefill
        result = self._launch(stream, work)
        event = self._torch.cuda.Event()
        event.record(stream)
        self._pending.append(_Pending(work, result, event))

    def prefill_busy(self) -> bool:
        return bool(self._pending) and not self._pending[-1].event.query()

    def wait_prefill(self) -> object:
        if not self._pending:
            return None
        last = self._pending[-1]
        last.event.synchronize()  # one stream: the last slice done means all are
        self._pending.clear()
        return last.result

    def collect_prefill(self, in_flight: int, block: bool = False) -> int:
        if block:
            self.wait_prefill()
            return in_flight
        done = 0
        while self._pending and self._pending[0].event.query():
            self._pending.popleft()
            done += 1
        return done

    def run_decode(self, work: Work[R]) -> R:
        stream = self._current().decode
        out = self._launch(stream, work)
        stream.synchronize()
        return out

    def run_whole(self, work: Work[R]) -> R:
        out = self._launch(self._whole, work)
        self._whole.synchronize()
        return out

    # -- the rest ----------------------------------------------------------------------------
    def describe(self) -> DeviceDescription:
        out = super().describe()
        out.extra.update({k: v for k, v in self.gc.describe().items() if k != "name"})
        out.extra.update({"gpu": self.gc.name, "levels_requested": [list(g) for g in self.wanted],
                          "levels_realized": [list(r) for r in self.realized],
                          "dropped_levels": [{"level": self.wanted.index(g), "requested": list(g), "reason": r}
                                             for g, r in self.dropped],
                          "levels_carve": self.carves(),
                          "prefill_slices_in_flight": self.max_prefill_in_flight,
                          "max_connections": max_connections_state(),
                          "balanced_workqueues": self.balanced_workqueues})
        return out

    def _sync_all(self) -> None:
        streams = [self._whole, self._whole_prefill, self._whole_decode]
        for lvl in self._made.values():
            streams += [lvl.prefill, lvl.decode]
        for s in streams:
            s.synchronize()

    def _synchronize(self) -> None:
        self._torch.cuda.synchronize(self.tdev)

    def close(self) -> None:
        """Free what listeners captured on the levels' streams (`listener({})`: the decode graphs),
        synchronize, then give the levels back to the process's pool: their streams and green contexts
        stay alive, for tensors that outlive this device (a runner's pinned buffers, a prefill's
        activations) and for the next device with the same levels."""
        if self._closed:
            return
        self._closed = True
        listeners, pairs = list(self._listeners), [lvl.pair for lvl in self._made.values() if lvl.pair is not None]
        try:
            self._sync_all()
            retire_levels(self.gc, pairs, listeners, {}, self._synchronize)
        finally:
            self._made.clear()
            self._active.clear()
            self._pending.clear()
            self._listeners.clear()


T = TypeVar("T")


Group = tuple[int, int]


def make_levels(wanted: list[Group], make: Callable[[Group], T],
                existing: dict[Group, T]) -> tuple[dict[Group, T], list[tuple[Group, str]]]:
    """Each distinct level of `wanted`: from `existing`, else `make(group)`. A level `make` refuses
    (DeviceError) is dropped with a one-line warning naming it; returns (made, dropped with reasons)."""
    made: dict[tuple[int, int], T] = {}
    dropped: dict[tuple[int, int], str] = {}
    for i, g in enumerate(wanted):
        if g in made or g in dropped:
            continue
        try:
            made[g] = existing[g] if g in existing else make(g)
        except DeviceError as exc:
            dropped[g] = str(exc)
            log.warning("pdtop: level %d %s dropped: %s", i, list(g), exc)
    return made, list(dropped.items())


def carve_record(pair: GreenPair) -> dict[str, Any]:
    """A level's first carve as the check records it: the outer context's SMs and partition limits, or why
    it was not made."""
    limits = None if pair.outer_limits is None else pair.outer_limits.as_dict()
    return {"outer_sms": pair.outer_sms, "note": pair.carve_note, "outer_limits": limits}


def retire_levels(gc: GreenContexts, pairs: list[GreenPair], listeners: list[StreamsListener],
                  streams: dict[int, torch.cuda.Stream], synchronize: Callable[[], None]) -> None:
    """Give `pairs` back to `gc` once this device is done with their streams: each listener is told the
    decode streams that remain (`streams`; `{}` when the device closes) and drops its CUDA graphs of
    the others, the device is synchronized, then the pairs go back (even if a listener failed: its
    error propagates once they have). Never destroyed: tensors used on their streams may outlive this."""
    try:
        for listener in listeners:
            listener(streams)
        synchronize()
    finally:
        for pair in pairs:
            gc.release(pair)


def _decode_streams(levels: list[_Level], whole: torch.cuda.Stream) -> dict[int, torch.cuda.Stream]:
    """Each distinct decode stream of `levels`, and the whole-device one (`run_whole`), by raw handle."""
    out = {int(lvl.decode.cuda_stream): lvl.decode for lvl in levels}
    out[int(whole.cuda_stream)] = whole
    return out
