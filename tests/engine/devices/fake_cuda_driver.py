"""A stand-in for `cuda.bindings.driver` with a GPU's SM partitioning rules, for machines without one.

It implements only the calls `green_ctx.GreenContexts` makes, with their return shapes
((CUresult, outputs...)), and the driver's documented rounding: a split group gets
`minCount` rounded up to the SM alignment (at least the minimum partition size), the
driver makes fewer groups when they do not fit, and the rest is the remainder. What a real
driver does when `minCount` rounds past the input (132 of 132 SMs in steps of 8) is not
documented: `oversize` picks it ("none": no group, with success; "error":
CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION; "all": one group of the whole input).
`cuda13=False` leaves `minSmPartitionSize`/`smCoscheduledAlignment` out of the resources,
as CUDA 12 bindings do. `fail_create` makes `cuGreenCtxCreate`
fail for contexts of those SM counts.

For `sm_probe` it also keeps device memory, libraries, a context stack and, per stream, the
SMs its context holds (each split group a run of SM ids): a `pdtop_smid` launch writes, for
each block, one of those ids (all of the GPU's with `leaky=True`: contexts that do not
isolate), and a `pdtop_fma` launch adds work / SMs to a virtual clock (`clock()`) that
`cuStreamSynchronize` advances. `FakeNvrtc` stands in for `cuda.bindings.nvrtc`, and
`fake_cuda_device` makes a `CudaDevice` on this driver with stand-ins for torch's streams.

A stream that was destroyed, or whose green context was, is refused by every call that takes
it (`CUDA_ERROR_CONTEXT_IS_DESTROYED`, what the H100 answered torch's event record on such a
stream). `CachedBlock` does what torch's caching allocators do with a block used on several
streams: when it is freed, one `cuEventRecord` on each (on a GPU that happens in a tensor's
destructor, where a failure aborts the process).
"""
from __future__ import annotations

import ctypes
import enum
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pdtop.engine.devices.cuda import CudaDevice
from pdtop.engine.devices.green_ctx import GreenContexts


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915


@dataclass
class Sm:
    smCount: int
    minSmPartitionSize: int = 0
    smCoscheduledAlignment: int = 0


@dataclass
class Resource:
    sm: Any
    owner: int = 0  # id of the split (or device) this came from
    first: int = 0  # its SMs are first, first + 1, ... (for the probe's %smid)


@dataclass
class FakeDriver:
    sms: int = 132
    cc: tuple[int, int] = (9, 0)
    min_part: int = 8
    align: int = 8
    cuda13: bool = True
    name: bytes = b"NVIDIA H200\0\0\0"
    pci: bytes = b"0000:65:00.0\0"
    uuid: bytes = bytes(range(16))
    fail_create: set[int] = field(default_factory=set)
    oversize: str = "none"
    leaky: bool = False
    ctx_align: int | None = None  # the alignment a green context's own SM resource reports (default: align)
    fail_load: bool = False
    __version__: str = "13.0.0"
    live_contexts: dict[int, Resource] = field(default_factory=dict)
    live_streams: set[int] = field(default_factory=set)
    stream_ctx: dict[int, int] = field(default_factory=dict)  # green-context stream -> its context
    dead_streams: set[int] = field(default_factory=set)  # destroyed, or on a destroyed context
    events: dict[int, int | None] = field(default_factory=dict)  # event -> the stream last recorded on
    calls: list[str] = field(default_factory=list)
    stream_sms: dict[int, tuple[int, int]] = field(default_factory=dict)  # stream -> (first SM, count)
    memory: dict[int, bytearray] = field(default_factory=dict)
    libraries: set[int] = field(default_factory=set)
    ctx_stack: list[Any] = field(default_factory=list)
    now: float = 0.0
    pending: dict[int, float] = field(default_factory=dict)

    CUdevResourceType = SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM=1)
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76)
    CUgreenCtxCreate_flags = SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)

    def _sm(self, count: int, align: int | None = None) -> Sm:
        return Sm(count, self.min_part, align or self.align) if self.cuda13 else Sm(count)

    def _ok(self, name: str, *outs: Any) -> tuple:
        self.calls.append(name)
        return (CUresult.CUDA_SUCCESS, *outs)

    # -- device ----------------------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple:
        return self._ok("cuInit")

    def cuDriverGetVersion(self) -> tuple:
        return self._ok("cuDriverGetVersion", 13000)

    def cuDeviceGetCount(self) -> tuple:
        return self._ok("cuDeviceGetCount", 1)

    def cuDeviceGet(self, index: int) -> tuple:
        return self._ok("cuDeviceGet", index)

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> tuple:
        return self._ok("cuDeviceGetAttribute", self.cc[0] if attr == 75 else self.cc[1])

    def cuDeviceGetName(self, length: int, dev: int) -> tuple:
        return self._ok("cuDeviceGetName", self.name)

    def cuDeviceGetPCIBusId(self, length: int, dev: int) -> tuple:
        return self._ok("cuDeviceGetPCIBusId", self.pci)

    def cuDeviceGetUuid(self, dev: int) -> tuple:
        return self._ok("cuDeviceGetUuid", SimpleNamespace(bytes=self.uuid))

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        return self._ok("cuDevicePrimaryCtxRetain", object())

    def cuDevicePrimaryCtxRelease(self, dev: int) -> tuple:
        return self._ok("cuDevicePrimaryCtxRelease")

    def cuDeviceGetDevResource(self, dev: int, kind: int) -> tuple:
        return self._ok("cuDeviceGetDevResource", Resource(self._sm(self.sms)))

    # -- green contexts --------------------------------------------------------------------
    def cuDevSmResourceSplitByCount(self, nb_groups: int, resource: Resource, flags: int, min_count: int) -> tuple:
        align = resource.sm.smCoscheduledAlignment or self.align  # the resource's own, as CUDA 13 reports it
        size = -(-max(min_count, self.min_part) // align) * align
        have = resource.sm.smCount
        if size > have and min_count <= have and self.oversize != "none":
            if self.oversize == "error":
                return (CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,)
            size = have
        made = min(nb_groups, have // size)
        split = next(self._ids)
        groups = [Resource(self._sm(size), split, resource.first + i * size) for i in range(made)]
        rest = Resource(self._sm(resource.sm.smCount - made * size), split, resource.first + made * size)
        return self._ok("cuDevSmResourceSplitByCount", groups, made, rest)

    def cuDevResourceGenerateDesc(self, resources: list[Resource], n: int) -> tuple:
        if len(resources) != n or len({r.owner for r in resources}) != 1:
            return (CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,)
        return self._ok("cuDevResourceGenerateDesc", list(resources))

    def cuGreenCtxCreate(self, desc: list[Resource], dev: int, flags: int) -> tuple:
        count = sum(r.sm.smCount for r in desc)
        if count in self.fail_create or count < 1:
            return (CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,)
        ctx = next(self._ids)
        self.live_contexts[ctx] = Resource(self._sm(count, self.ctx_align), ctx, desc[0].first)
        return self._ok("cuGreenCtxCreate", ctx)

    def cuGreenCtxGetDevResource(self, ctx: int, kind: int) -> tuple:
        return self._ok("cuGreenCtxGetDevResource", self.live_contexts[ctx])

    def cuGreenCtxStreamCreate(self, ctx: int, flags: int, priority: int) -> tuple:
        stream = next(self._ids) * 1000
        self.live_streams.add(stream)
        res = self.live_contexts[ctx]
        self.stream_sms[stream] = (res.first, res.sm.smCount)
        self.stream_ctx[stream] = ctx
        return self._ok("cuGreenCtxStreamCreate", stream)

    def _dead(self, stream: int) -> bool:
        return int(stream) in self.dead_streams

    def cuStreamDestroy(self, stream: int) -> tuple:
        if self._dead(stream):
            return (CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,)
        self.live_streams.remove(stream)
        self.dead_streams.add(int(stream))
        return self._ok("cuStreamDestroy")

    def cuGreenCtxDestroy(self, ctx: int) -> tuple:
        del self.live_contexts[ctx]
        self.dead_streams |= {s for s, c in self.stream_ctx.items() if c == ctx}
        return self._ok("cuGreenCtxDestroy")

    def cuEventCreate(self, flags: int) -> tuple:
        event = next(self._ids)
        self.events[event] = None
        return self._ok("cuEventCreate", event)

    def cuEventRecord(self, event: int, stream: int) -> tuple:
        if self._dead(stream):
            return (CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,)
        self.events[event] = int(stream)
        return self._ok("cuEventRecord")

    # -- what sm_probe uses ---------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def cuCtxPushCurrent(self, ctx: Any) -> tuple:
        self.ctx_stack.append(ctx)
        return self._ok("cuCtxPushCurrent")

    def cuCtxPopCurrent(self) -> tuple:
        if not self.ctx_stack:
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return self._ok("cuCtxPopCurrent", self.ctx_stack.pop())

    def cuStreamCreate(self, flags: int) -> tuple:
        stream = next(self._ids) * 1000
        self.live_streams.add(stream)
        self.stream_sms[stream] = (0, self.sms)
        return self._ok("cuStreamCreate", stream)

    def cuLibraryLoadData(self, code: int, *options: Any) -> tuple:
        if self.fail_load:
            return (CUresult.CUDA_ERROR_INVALID_IMAGE,)
        lib = next(self._ids)
        self.libraries.add(lib)
        return self._ok("cuLibraryLoadData", lib)

    def cuLibraryGetKernel(self, lib: int, name: bytes) -> tuple:
        return self._ok("cuLibraryGetKernel", name.decode())

    def cuLibraryUnload(self, lib: int) -> tuple:
        self.libraries.remove(lib)
        return self._ok("cuLibraryUnload")

    def cuMemAlloc(self, size: int) -> tuple:
        if not self.ctx_stack:
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        ptr = next(self._ids) << 20
        self.memory[ptr] = bytearray(size)
        return self._ok("cuMemAlloc", ptr)

    def cuMemFree(self, ptr: int) -> tuple:
        del self.memory[ptr]
        return self._ok("cuMemFree")

    def cuMemsetD32Async(self, ptr: int, value: int, count: int, stream: int) -> tuple:
        self.memory[ptr][:4 * count] = value.to_bytes(4, "little") * count
        return self._ok("cuMemsetD32Async")

    def cuMemcpyDtoH(self, dst: int, src: int, size: int) -> tuple:
        ctypes.memmove(dst, bytes(self.memory[src][:size]), size)
        return self._ok("cuMemcpyDtoH")

    def cuLaunchKernel(self, kernel: str, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shared: int, stream: int, params: int, extra: int) -> tuple:
        if self._dead(stream):
            return (CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,)
        first, count = (0, self.sms) if self.leaky else self.stream_sms.get(int(stream), (0, self.sms))
        args = (ctypes.c_void_p * 2).from_address(params)
        ptr = ctypes.c_uint64.from_address(args[0]).value
        if kernel == "pdtop_smid":
            for b in range(gx):
                self.memory[ptr][4 * b:4 * b + 4] = (first + b % count).to_bytes(4, "little")
        elif kernel == "pdtop_fma":
            iters = ctypes.c_int.from_address(args[1]).value
            resident = 2048 // bx  # blocks an SM holds at once; the launch runs in waves of count * resident
            waves = -(-gx // (count * resident))
            self.pending[int(stream)] = self.pending.get(int(stream), 0.0) + waves * resident * bx * iters * 1e-12
        return self._ok("cuLaunchKernel")

    def cuStreamSynchronize(self, stream: int) -> tuple:
        if self._dead(stream):
            return (CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,)
        self.now += self.pending.pop(int(stream), 0.0)
        return self._ok("cuStreamSynchronize")


@dataclass
class FakeNvrtc:
    """`cuda.bindings.nvrtc`'s calls `sm_probe.compile_cubin` makes; `fail` makes the compile fail with a log."""

    fail: bool = False
    options: list[bytes] = field(default_factory=list)
    live: set[int] = field(default_factory=set)

    def nvrtcCreateProgram(self, src: bytes, name: bytes, n: int, headers: list, names: list) -> tuple:
        self.live.add(id(src))
        return (0, id(src))

    def nvrtcCompileProgram(self, prog: int, n: int, options: list[bytes]) -> tuple:
        self.options = list(options)
        return (6 if self.fail else 0,)  # NVRTC_ERROR_COMPILATION

    def nvrtcGetProgramLogSize(self, prog: int) -> tuple:
        return (0, 32)

    def nvrtcGetProgramLog(self, prog: int, log: bytes) -> tuple:
        ctypes.memmove(log, b"probe.cu(3): error: bad asm\n\0", 30)
        return (0,)

    def nvrtcGetCUBINSize(self, prog: int) -> tuple:
        return (0, 8)

    def nvrtcGetCUBIN(self, prog: int, out: bytes) -> tuple:
        ctypes.memmove(out, b"\x7fELFcub", 8)
        return (0,)

    def nvrtcDestroyProgram(self, prog: int) -> tuple:
        self.live.discard(prog)
        return (0,)


_stream_ids = itertools.count(1)


class FakeStream:
    """torch.cuda.Stream's part the cuda device uses (a handle, synchronize, priority)."""

    def __init__(self, device: Any = None, priority: int = 0):
        self.cuda_stream, self.priority = -next(_stream_ids), priority

    def synchronize(self) -> None:
        pass


class FakeExternalStream(FakeStream):
    def __init__(self, handle: int, device: Any = None):
        self.cuda_stream, self.priority = handle, 0


def fake_cuda_device(drv: FakeDriver, groups: list[tuple[int, int]] | None = None,
                     gc: GreenContexts | None = None) -> CudaDevice:
    """A `CudaDevice` on `drv` (SGLang's levels unless `groups`), torch's streams stood in for; `gc`: the
    contexts it takes its levels from (as `green_ctx.shared` is on a GPU; default: new ones)."""
    torch_streams = SimpleNamespace(cuda=SimpleNamespace(
        Stream=FakeStream, ExternalStream=FakeExternalStream,
        synchronize=lambda device: drv.calls.append("synchronize")))
    dev = CudaDevice.__new__(CudaDevice)
    dev._start(torch_streams, "cuda:0", gc or GreenContexts(driver=drv), groups, 8, False)
    return dev


@dataclass
class CachedBlock:
    """A block of torch's caching allocators as it meets the driver: the streams it was used on (the
    device allocator's `record_stream`, the pinned host allocator's non-blocking copies: a decoder's
    staging buffers), and at its free one event recorded on each (`insert_events`,
    `CachingHostAllocator::free`). On a GPU the free runs in the tensor's destructor, where an error
    terminates the process; here it raises."""

    drv: FakeDriver
    streams: set[int] = field(default_factory=set)

    def use_on(self, stream: Any) -> None:
        self.streams.add(int(stream.cuda_stream))

    def free(self) -> None:
        for stream in sorted(self.streams):
            event = self.drv.cuEventCreate(0)[1]
            code = self.drv.cuEventRecord(event, stream)[0]
            if code != CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{CUresult(code).name} recording an event on stream {stream} at a block's "
                                   f"free: on a GPU, terminate in a tensor's destructor")
        self.streams.clear()
