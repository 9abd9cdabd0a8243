"""Raw CUDA driver calls for green contexts, through cuda-python (`cuda.bindings.driver`).

One `GreenPair` is one split level: the device's SMs cut in two, a green context on
each part, and one non-blocking stream on each. Every CUresult is checked; anything a
machine lacks (cuda-python, a driver, a GPU, green contexts) becomes a one-line
`DeviceError` saying what is missing. This module never imports torch.

Driver requirements: green contexts need a CUDA 12.4+ driver, streams created on them
(`cuGreenCtxStreamCreate`) 12.5+, the optional balanced workqueues 13.1+. cuda-bindings
13.x needs a CUDA 13 (R580+) driver; on a CUDA 12 driver install cuda-python 12.x.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import round_sms, sm_granularity  # noqa: F401 (re-exported for callers)

GREEN_CTX_MIN_DRIVER = 12040  # cuGreenCtxCreate, cuDevSmResourceSplitByCount
STREAM_MIN_DRIVER = 12050  # cuGreenCtxStreamCreate
WORKQUEUE_MIN_DRIVER = 13010  # CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG (balanced workqueues)
INSTALL_HINT = "pip install 'pdtop[gpu]' (cuda-python)"


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
                          f"green contexts need cuda-python 12.5+ ({INSTALL_HINT})")
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
    realized: tuple[int, int]  # what the driver gave (resource.sm.smCount)
    prefill_stream: int
    decode_stream: int
    _handles: list[Any] = field(default_factory=list, repr=False)  # [ctx_p, ctx_d, stream_p, stream_d]


class GreenContexts:
    """The driver side of one GPU: initialises CUDA, checks versions, makes and destroys split levels."""

    def __init__(self, index: int = 0):
        self.drv = load_driver()
        drv = self.drv
        call(drv, "cuInit", 0)
        self.driver_version = int(call(drv, "cuDriverGetVersion"))
        self.bindings = bindings_version()
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
        name = call(drv, "cuDeviceGetName", 256, self.dev)
        self.name = (name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)).strip()
        # Green contexts retain the primary context; holding it avoids re-creating it per level.
        self._primary = call(drv, "cuDevicePrimaryCtxRetain", self.dev)
        self.total_sms = int(self._sm_resource().sm.smCount)
        self.pairs: list[GreenPair] = []
        self._closed = False

    def _sm_resource(self) -> Any:
        """The whole device's SM resource (queried per split: split outputs cannot be split again)."""
        return call(self.drv, "cuDeviceGetDevResource", self.dev, self.drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)

    def _workqueue_resource(self) -> Any:
        """A workqueue config asking for non-overlapping workqueues between balanced green contexts."""
        if self.driver_version < WORKQUEUE_MIN_DRIVER:
            raise DeviceError("balanced workqueues need a CUDA 13.1+ driver; this driver supports "
                              f"CUDA {version_str(self.driver_version)}")
        drv = self.drv
        wq = call(drv, "cuDeviceGetDevResource", self.dev, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG)
        wq.wqConfig.sharingScope = drv.CUdevWorkqueueConfigScope.CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED
        return wq

    def split(self, prefill_sms: int, decode_sms: int | None = None, balanced_workqueues: bool = False) -> GreenPair:
        """Carve `prefill_sms` (rounded up to the granularity) off the device; the rest is decode's.

        `balanced_workqueues` (CUDA 13.1+) also asks the driver to keep the two sides'
        submissions on separate hardware workqueues, so launches do not queue behind each other.
        """
        drv = self.drv
        extra = [self._workqueue_resource()] if balanced_workqueues else []
        want_p = round_sms(prefill_sms, self.major)
        want_d = self.total_sms - want_p if decode_sms is None else decode_sms
        if want_p + want_d > self.total_sms or want_d < 1:
            raise DeviceError(f"split ({prefill_sms}, {want_d}) needs {want_p + want_d} SMs after rounding "
                              f"prefill to {want_p}; {self.name} has {self.total_sms}")
        handles: list[Any] = []
        try:
            groups, n, rest = call(drv, "cuDevSmResourceSplitByCount", 1, self._sm_resource(), 0, want_p)
            if int(n) < 1 or not groups:
                raise DeviceError(f"cuDevSmResourceSplitByCount made no group of {want_p} SMs")
            part = groups[0]
            got_p, got_d = int(part.sm.smCount), int(rest.sm.smCount)
            if got_p < want_p or got_d < want_d:
                raise DeviceError(f"green contexts got ({got_p}, {got_d}) SMs for a requested "
                                  f"({want_p}, {want_d}) split on {self.name} ({self.total_sms} SMs)")
            flag = drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
            for res in (part, rest):
                desc = call(drv, "cuDevResourceGenerateDesc", [res, *extra], 1 + len(extra))
                handles.append(call(drv, "cuGreenCtxCreate", desc, self.dev, flag))
            nb = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
            for ctx in handles[:2]:
                handles.append(call(drv, "cuGreenCtxStreamCreate", ctx, nb, 0))
        except BaseException:
            _destroy(drv, handles)
            raise
        pair = GreenPair((want_p, want_d), (got_p, got_d), int(handles[2]), int(handles[3]), handles)
        self.pairs.append(pair)
        return pair

    def destroy(self, pair: GreenPair) -> None:
        """Destroy a level's streams, then its green contexts; the caller has synchronized them."""
        self.pairs = [p for p in self.pairs if p is not pair]
        errors = _destroy(self.drv, pair._handles)
        pair._handles = []
        if errors:
            raise DeviceError("; ".join(errors))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for pair in list(self.pairs):
            errors += _destroy(self.drv, pair._handles)
            pair._handles = []
        self.pairs.clear()
        try:
            call(self.drv, "cuDevicePrimaryCtxRelease", self.dev)
        except DeviceError as e:
            errors.append(str(e))
        if errors:
            raise DeviceError("; ".join(errors))

    def describe(self) -> dict:
        return {"name": self.name, "index": self.index, "cc": f"{self.major}.{self.minor}",
                "sms": self.total_sms, "driver_cuda": version_str(self.driver_version),
                "cuda_bindings": self.bindings}


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


def _destroy(drv: Any, handles: list[Any]) -> list[str]:
    """Streams first (they outlive nothing), then contexts; returns the errors instead of stopping."""
    errors: list[str] = []
    streams, ctxs = handles[2:], handles[:2]
    for name, items in (("cuStreamDestroy", streams), ("cuGreenCtxDestroy", ctxs)):
        for h in items:
            try:
                call(drv, name, h)
            except DeviceError as e:
                errors.append(str(e))
    return errors
