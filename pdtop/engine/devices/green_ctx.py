"""Raw CUDA driver calls for green contexts, through cuda-python (`cuda.bindings.driver`).

One `GreenPair` is one split level, carved as SGLang carves it (`sm_split`): `p + d` SMs
into one green context (always, as `sgl_kernel` does), those cut in two, a green context on
each part, and one non-blocking stream on each; the realized counts are read back from the contexts
(`cuGreenCtxGetDevResource`). Partition limits come from the driver where CUDA 13
reports them (`minSmPartitionSize`, `smCoscheduledAlignment`), else from the seed's
table. Every CUresult is checked; anything a
machine lacks (cuda-python, a driver, a GPU, green contexts) becomes a one-line
`DeviceError` saying what is missing. This module never imports torch.

A level a device runs on (`GreenContexts.acquire`) is kept for the process's life, never
destroyed: torch's caching allocators remember every stream a block was used on (`record_stream`,
a pinned buffer's non-blocking copy) and record an event on each when the block is freed, which may
be long after the device closed; on a destroyed stream that fails inside a destructor and aborts
the process (the first H100 run). A device gives its levels back (`release`) and the next device
asking for the same split gets them again, as SGLang keeps its stream groups for the process's
life; `shared(index)` is the one `GreenContexts` per GPU that holds them. Only pairs no torch
work ever ran on (`split`, then `destroy`: `pdtop levels`, a probe of a manual division) are
destroyed.

Driver requirements: green contexts need a CUDA 12.4+ driver, streams created on them
(`cuGreenCtxStreamCreate`) 12.5+, the optional balanced workqueues 13.1+. cuda-bindings
13.x needs a CUDA 13 (R580+) driver; on a CUDA 12 driver install cuda-python 12.x.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.devices.sm_split import PartitionLimits, plan_split, why_not
from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import round_sms, sm_granularity  # noqa: F401 (re-exported for callers)

GREEN_CTX_MIN_DRIVER = 12040  # cuGreenCtxCreate, cuDevSmResourceSplitByCount
STREAM_MIN_DRIVER = 12050  # cuGreenCtxStreamCreate
WORKQUEUE_MIN_DRIVER = 13010  # CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG (balanced workqueues)
MAX_KEPT_PAIRS = 64  # levels kept for the process's life per GPU: SGLang's 8 and room for several manual tables
INSTALL_HINT = "pip install 'pdtop[gpu]'"  # cuda-python and nvidia-ml-py
log = logging.getLogger(__name__)


def version_str(v: int) -> str:
    """12040 -> '12.4'."""
    return f"{v // 1000}.{v % 1000 // 10}"


def load_driver() -> Any:
    """The cuda-python driver module: `cuda.bindings.driver` (12.6+/13.x) or the old `cuda.cuda`."""
    try:
        from cuda.bindings import driver
        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # cuda-python < 12.6
        return driver
    except ImportError:
        raise DeviceError(f"cuda-python is not installed: {INSTALL_HINT}") from None


def bindings_version() -> str:
    try:
        import cuda.bindings as cb
        return str(getattr(cb, "__version__", "?"))
    except ImportError:
        try:
            import cuda
            return str(getattr(cuda, "__version__", "?"))
        except ImportError:
            return "none"


def _err_name(code: Any) -> str:
    return f"{getattr(code, 'name', 'CUresult')} ({int(code)})"


def call(drv: Any, name: str, *args: Any) -> Any:
    """Call `drv.<name>(*args)`, check its CUresult, return its outputs (None, one value, or a tuple)."""
    fn = getattr(drv, name, None)
    if fn is None:
        raise DeviceError(f"{name} is missing from cuda-python {bindings_version()}: "
                          f"green contexts need cuda-python 12.5+: {INSTALL_HINT}")
    try:
        res = fn(*args)
    except DeviceError:
        raise
    except Exception as e:  # driver library missing, symbol missing in an old driver
        raise DeviceError(f"{name} failed: {_one_line(e)}") from None
    code, outs = res[0], res[1:]
    if int(code) != 0:
        raise DeviceError(f"{name} failed: {_err_name(code)}{_hint(name, int(code))}")
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else outs


def _one_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    msg = lines[0] if lines else type(e).__name__
    if "LibNotFound" in type(e).__name__ or "libcuda" in msg or "dlopen" in msg:
        return f"no NVIDIA driver (libcuda.so) found ({msg})"
    if "not found" in msg.lower():
        return f"this NVIDIA driver lacks the call ({msg}); green contexts need CUDA 12.4+, their streams 12.5+"
    return msg


_HINTS = {
    100: ": no CUDA GPU is visible",  # CUDA_ERROR_NO_DEVICE
    35: ": the NVIDIA driver is too old for this cuda-python",  # CUDA_ERROR_INSUFFICIENT_DRIVER
    801: ": green contexts are not supported on this GPU or driver",  # CUDA_ERROR_NOT_SUPPORTED
    914: ": the SM resource cannot be split this way",  # CUDA_ERROR_INVALID_RESOURCE_TYPE
    915: ": the SM resource cannot be split this way",  # CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
}


def _hint(name: str, code: int) -> str:
    return _HINTS.get(code, "")


@dataclass
class GreenPair:
    """One split level: a green context and a stream on each side; streams are raw CUstream ints."""

    requested: tuple[int, int]  # (prefill SMs, decode SMs) asked for
    realized: tuple[int, int]  # what the two contexts hold (cuGreenCtxGetDevResource)
    prefill_stream: int
    decode_stream: int
    outer_sms: int | None = None  # what the first carve's context holds (None: the device was split directly)
    carve_note: str | None = None  # why the first carve was not made, if it was not
    outer_limits: PartitionLimits | None = None  # the first carve's context's own partition limits
    balanced_workqueues: bool = False
    kept: bool = False  # handed to a device (`acquire`): never destroyed
    _streams: list[Any] = field(default_factory=list, repr=False)
    _contexts: list[Any] = field(default_factory=list, repr=False)  # prefill, decode, then the carved outer one


class GreenContexts:
    """The driver side of one GPU: initialises CUDA, checks versions, makes and destroys split levels.

    `driver` replaces `cuda.bindings.driver` (tests pass a fake one).
    """

    def __init__(self, index: int = 0, driver: Any = None):
        self.drv = driver if driver is not None else load_driver()
        drv = self.drv
        call(drv, "cuInit", 0)
        self.driver_version = int(call(drv, "cuDriverGetVersion"))
        self.bindings = bindings_version() if driver is None else str(getattr(driver, "__version__", "?"))
        check_driver_versions(self.driver_version, self.bindings)
        count = int(call(drv, "cuDeviceGetCount"))
        if count == 0:
            raise DeviceError("no CUDA GPU is visible (cuDeviceGetCount = 0)")
        if not 0 <= index < count:
            raise DeviceError(f"CUDA device index {index} out of range: {count} GPU(s) visible")
        self.index = index
        self.dev = call(drv, "cuDeviceGet", index)
        attr = drv.CUdevice_attribute
        self.major = int(call(drv, "cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev))
        self.minor = int(call(drv, "cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev))
        if self.major < 6:
            raise DeviceError(f"compute capability {self.major}.{self.minor} has no green contexts (6.0+ needed)")
        self.name = _text(call(drv, "cuDeviceGetName", 256, self.dev))
        self.pci_bus_id, self.uuid = _pci_bus_id(drv, self.dev), _uuid(drv, self.dev)
        # Green contexts retain the primary context; holding it avoids re-creating it per level.
        self._primary = call(drv, "cuDevicePrimaryCtxRetain", self.dev)
        whole = self._sm_resource()
        self.total_sms = int(whole.sm.smCount)
        self.limits = partition_limits(whole.sm, self.major)
        self.pairs: list[GreenPair] = []  # every pair made and not destroyed, kept ones included
        self._free: dict[tuple[int, int, bool], list[GreenPair]] = {}  # kept pairs no device holds, by split
        self._lock = threading.Lock()
        self._closed = False

    @property
    def primary(self) -> Any:
        """The device's primary context (retained here), for calls that need a current context."""
        return self._primary

    def _sm_resource(self) -> Any:
        """The whole device's SM resource (queried per split: split outputs cannot be split again)."""
        return call(self.drv, "cuDeviceGetDevResource", self.dev, self.drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)

    def _ctx_sms(self, ctx: Any) -> Any:
        return call(self.drv, "cuGreenCtxGetDevResource", ctx, self.drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)

    def _workqueue_resource(self) -> Any:
        """A workqueue config asking for non-overlapping workqueues between balanced green contexts."""
        if self.driver_version < WORKQUEUE_MIN_DRIVER:
            raise DeviceError("balanced workqueues need a CUDA 13.1+ driver; this driver supports "
                              f"CUDA {version_str(self.driver_version)}")
        drv = self.drv
        wq = call(drv, "cuDeviceGetDevResource", self.dev, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG)
        wq.wqConfig.sharingScope = drv.CUdevWorkqueueConfigScope.CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED
        return wq

    def _split_one(self, resource: Any, count: int) -> tuple[Any, Any]:
        """One group of at least `count` SMs out of `resource`, and the remainder."""
        groups, n, rest = call(self.drv, "cuDevSmResourceSplitByCount", 1, resource, 0, count)
        if int(n) < 1 or not groups:
            raise DeviceError(f"the driver made no group of {count} SMs out of {int(resource.sm.smCount)}")
        return groups[0], rest

    def _context(self, resources: list[Any]) -> Any:
        desc = call(self.drv, "cuDevResourceGenerateDesc", resources, len(resources))
        return call(self.drv, "cuGreenCtxCreate", desc, self.dev,
                    self.drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)

    def split(self, prefill_sms: int, decode_sms: int, balanced_workqueues: bool = False) -> GreenPair:
        """A level of `prefill_sms` + `decode_sms`, carved as SGLang's `create_greenctx_stream_by_value`
        does (`sm_split.plan_split`): always `p + d` SMs into one green context first, then `p` of
        that context's SMs for prefill and the rest for decode. Only if the driver will not carve a
        whole-device level's count out of the device (the count rounds past it: no group, or an
        error) is the device's own resource split instead, and `GreenPair.carve_note` says so.
        The realized counts are read back from the two contexts; DeviceError (saying why) when the
        level cannot be made.

        `balanced_workqueues` (CUDA 13.1+) also asks the driver to keep the two sides'
        submissions on separate hardware workqueues, so launches do not queue behind each other.
        """
        requested = (int(prefill_sms), int(decode_sms))
        p, d = requested
        planned = plan_split(p, d, self.total_sms, self.limits)
        if planned is None:
            raise DeviceError(f"{self.name} cannot carve it: {why_not(p, d, self.total_sms, self.limits)}")
        extra = [self._workqueue_resource()] if balanced_workqueues else []
        pair = GreenPair(requested, (0, 0), 0, 0, balanced_workqueues=balanced_workqueues)
        try:
            outer = self._carve_outer(pair, p + d, whole=sum(planned) == self.total_sms)
            part, rest = self._split_one(outer, p)  # step 2: prefill's part; decode gets the rest
            if int(rest.sm.smCount) < 1:
                raise DeviceError(f"prefill's {int(part.sm.smCount)} SMs leave decode none")
            for res in (rest, part):  # decode first: the list ends prefill, decode, outer
                pair._contexts.insert(0, self._context([res, *extra]))
            nb = self.drv.CUstream_flags.CU_STREAM_NON_BLOCKING
            for ctx in pair._contexts[:2]:
                pair._streams.append(call(self.drv, "cuGreenCtxStreamCreate", ctx, nb, 0))
            pair.realized = (int(self._ctx_sms(pair._contexts[0]).sm.smCount),
                             int(self._ctx_sms(pair._contexts[1]).sm.smCount))
        except BaseException:
            _destroy(self.drv, pair)
            raise
        pair.prefill_stream, pair.decode_stream = int(pair._streams[0]), int(pair._streams[1])
        self.pairs.append(pair)
        return pair

    def _carve_outer(self, pair: GreenPair, count: int, whole: bool) -> Any:
        """Step 1: `count` SMs of the device into a green context of their own (kept in `pair`);
        returns that context's SM resource, which step 2 splits. For a whole-device level (`whole`)
        the driver may make no group (the count rounds past the device): then the device's resource."""
        device = self._sm_resource()
        try:
            carved, _ = self._split_one(device, count)
        except DeviceError as e:
            if not whole:
                raise
            pair.carve_note = f"the driver made no {count}-SM context of the whole device ({e}): split the device"
            log.info("pdtop: level %s: %s", list(pair.requested), pair.carve_note)
            return device
        pair._contexts.append(self._context([carved]))
        outer = self._ctx_sms(pair._contexts[-1])
        pair.outer_sms, pair.outer_limits = int(outer.sm.smCount), partition_limits(outer.sm, self.major)
        return outer

    def acquire(self, prefill_sms: int, decode_sms: int, balanced_workqueues: bool = False) -> GreenPair:
        """A level for a device to run torch work on: a kept pair of this split that no device holds,
        else a new one (`split`; DeviceError as there), kept from then on. A kept pair is never
        destroyed (the module's docstring says why); at most `MAX_KEPT_PAIRS` are made per GPU."""
        key = (int(prefill_sms), int(decode_sms), bool(balanced_workqueues))
        with self._lock:
            if self._closed:
                raise DeviceError(f"{self.name}: its green contexts were closed")
            free = self._free.get(key)
            if free:
                return free.pop()
            kept = self.kept
            if kept >= MAX_KEPT_PAIRS:
                raise DeviceError(f"{self.name} already keeps {kept} green-context levels, the most one process "
                                  f"makes (tensors may still use their streams); restart to carve others")
            pair = self.split(*key)
            pair.kept = True
            return pair

    def release(self, pair: GreenPair) -> None:
        """A device gives a kept pair back (its streams synchronized): the next `acquire` of its split gets it."""
        if not pair.kept:
            raise ValueError(f"level {list(pair.requested)} was not acquired")
        with self._lock:
            free = self._free.setdefault((*pair.requested, pair.balanced_workqueues), [])
            if all(p is not pair for p in free):
                free.append(pair)

    @property
    def kept(self) -> int:
        """How many levels are kept for the process's life."""
        return sum(p.kept for p in self.pairs)

    def destroy(self, pair: GreenPair) -> None:
        """Destroy a level no torch work ran on (`split`, not `acquire`): its streams, then its green
        contexts; the caller has synchronized them. A kept pair is refused (ValueError)."""
        if pair.kept:
            raise ValueError(f"level {list(pair.requested)} is kept for the process's life: tensors may still "
                             f"use its streams")
        self.pairs = [p for p in self.pairs if p is not pair]
        errors = _destroy(self.drv, pair)
        if errors:
            raise DeviceError("; ".join(errors))

    def close(self) -> None:
        """Destroy the pairs no device was given and, unless some were (they stay alive, with the primary
        context they were made beside, for the process's life), let go of the primary context. `shared`
        ones are never closed."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
        errors: list[str] = []
        for pair in [p for p in self.pairs if not p.kept]:
            errors += _destroy(self.drv, pair)
        self.pairs = [p for p in self.pairs if p.kept]
        if not self.pairs:
            try:
                call(self.drv, "cuDevicePrimaryCtxRelease", self.dev)
            except DeviceError as e:
                errors.append(str(e))
        if errors:
            raise DeviceError("; ".join(errors))

    def describe(self) -> dict:
        return {"name": self.name, "index": self.index, "cc": f"{self.major}.{self.minor}",
                "sms": self.total_sms, "driver_cuda": version_str(self.driver_version),
                "cuda_bindings": self.bindings, "pci_bus_id": self.pci_bus_id, "uuid": self.uuid,
                "partition_limits": self.limits.as_dict(), "levels_kept": self.kept}


_shared: dict[int, GreenContexts] = {}
_shared_lock = threading.Lock()


def shared(index: int = 0) -> GreenContexts:
    """The process's one `GreenContexts` for GPU `index`, made at first use and never closed: the levels
    it keeps outlive every device that ran on them (DeviceError, nothing kept, when it cannot be made)."""
    with _shared_lock:
        gc = _shared.get(index)
        if gc is None:
            gc = _shared[index] = GreenContexts(index)
        return gc


def partition_limits(sm: Any, major: int) -> PartitionLimits:
    """`minSmPartitionSize` and `smCoscheduledAlignment` of an SM resource where the driver reports them
    (CUDA 13 bindings), else the seed's table for compute capability `major`."""
    min_part = int(getattr(sm, "minSmPartitionSize", 0) or 0)
    align = int(getattr(sm, "smCoscheduledAlignment", 0) or 0)
    if min_part > 0 and align > 0:
        return PartitionLimits(min_part, align, "driver")
    return PartitionLimits.from_table(major)


def _text(value: Any) -> str:
    """A driver string output (bytes with a NUL, or str) as text."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace").strip()
    return str(value).split("\0", 1)[0].strip()


def _pci_bus_id(drv: Any, dev: Any) -> str | None:
    """The GPU's PCI bus id (`0000:65:00.0`), or None if the driver will not say."""
    try:
        return _text(call(drv, "cuDeviceGetPCIBusId", 64, dev)) or None
    except DeviceError:
        return None


def _uuid(drv: Any, dev: Any) -> str | None:
    """The GPU's UUID as NVML writes it (`GPU-xxxxxxxx-xxxx-...`), or None if the driver will not say."""
    for name in ("cuDeviceGetUuid", "cuDeviceGetUuid_v2"):
        try:
            raw = call(drv, name, dev)
            b = raw.bytes if hasattr(raw, "bytes") else raw
            if isinstance(b, str):
                b = b.encode("latin-1")
            elif isinstance(b, (list, tuple)):  # signed chars
                b = bytes(x & 0xFF for x in b)
            b = bytes(b)[:16]
        except (DeviceError, TypeError, ValueError, UnicodeError):
            continue
        if len(b) == 16:
            h = b.hex()
            return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return None


def check_driver_versions(driver: int, bindings: str) -> None:
    """DeviceError if this driver (cuDriverGetVersion) cannot run green contexts with these bindings."""
    if driver < GREEN_CTX_MIN_DRIVER:
        raise DeviceError(f"green contexts need a CUDA 12.4+ driver; this driver supports CUDA {version_str(driver)}")
    if driver < STREAM_MIN_DRIVER:
        raise DeviceError("streams on green contexts (cuGreenCtxStreamCreate) need a CUDA 12.5+ driver; "
                          f"this driver supports CUDA {version_str(driver)}")
    major = bindings.split(".", 1)[0]
    if major.isdigit() and int(major) >= 13 and driver < 13000:
        raise DeviceError(f"cuda-bindings {bindings} needs a CUDA 13 (R580+) driver; this driver supports "
                          f"CUDA {version_str(driver)}: install cuda-python 12.x (pip install 'cuda-python>=12.5,<13')")


def _destroy(drv: Any, pair: GreenPair) -> list[str]:
    """Streams first (they outlive nothing), then contexts in order; returns the errors instead of stopping."""
    errors: list[str] = []
    for name, items in (("cuStreamDestroy", pair._streams), ("cuGreenCtxDestroy", pair._contexts)):
        for h in items:
            try:
                call(drv, name, h)
            except DeviceError as e:
                errors.append(str(e))
    pair._streams, pair._contexts = [], []
    return errors
