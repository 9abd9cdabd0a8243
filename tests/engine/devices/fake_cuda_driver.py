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
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
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
    __version__: str = "13.0.0"
    live_contexts: dict[int, Resource] = field(default_factory=dict)
    live_streams: set[int] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    CUdevResourceType = SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM=1)
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76)
    CUgreenCtxCreate_flags = SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)

    def _sm(self, count: int) -> Sm:
        return Sm(count, self.min_part, self.align) if self.cuda13 else Sm(count)

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
        size = -(-max(min_count, self.min_part) // self.align) * self.align
        have = resource.sm.smCount
        if size > have and min_count <= have and self.oversize != "none":
            if self.oversize == "error":
                return (CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,)
            size = have
        made = min(nb_groups, have // size)
        split = next(self._ids)
        groups = [Resource(self._sm(size), split) for _ in range(made)]
        rest = Resource(self._sm(resource.sm.smCount - made * size), split)
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
        self.live_contexts[ctx] = Resource(self._sm(count), ctx)
        return self._ok("cuGreenCtxCreate", ctx)

    def cuGreenCtxGetDevResource(self, ctx: int, kind: int) -> tuple:
        return self._ok("cuGreenCtxGetDevResource", self.live_contexts[ctx])

    def cuGreenCtxStreamCreate(self, ctx: int, flags: int, priority: int) -> tuple:
        stream = next(self._ids) * 1000
        self.live_streams.add(stream)
        return self._ok("cuGreenCtxStreamCreate", stream)

    def cuStreamDestroy(self, stream: int) -> tuple:
        self.live_streams.remove(stream)
        return self._ok("cuStreamDestroy")

    def cuGreenCtxDestroy(self, ctx: int) -> tuple:
        del self.live_contexts[ctx]
        return self._ok("cuGreenCtxDestroy")
