"""How many SMs a stream's kernels really run on, measured beside what the driver says it gave.

`cuGreenCtxGetDevResource` returns the count the driver assigned, which is what was asked for;
nothing there shows where the kernels run. Two independent measures per stream:

- `smid_distinct`: a wide launch of a kernel whose every block records `%smid`, with blocks big
  enough (1024 threads: two per SM) and spinning long enough (about 10 us) that they spread over
  every SM the stream's context allows; the distinct ids are counted.
- `timed_sms`: a compute-bound FMA kernel over many blocks, timed on the stream against the
  same launch on a whole-device stream: `total SMs x whole time / stream time`.

The kernels are compiled once with NVRTC (`cuda.bindings.nvrtc`, a cubin for the device's
compute capability) and loaded context-independently (`cuLibraryLoadData`): a `CUkernel`
launched with `cuLaunchKernel` runs in the context of the stream it is launched on (the CUDA
driver docs), so the same kernel runs inside each level's green context. A module loaded with
`cuModuleLoadData` would belong to the primary context, which green-context streams are not.
Buffers, the whole-device stream and the library are made with the primary context current
(pushed, then popped) and freed by `close()`. Every call goes through `green_ctx.call`, so a
failing CUresult or nvrtcResult is a one-line DeviceError. Never imports torch.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pdtop.engine.devices.green_ctx import GreenContexts, call
from pdtop.engine.errors import DeviceError

SOURCE = r"""
extern "C" __global__ void pdtop_smid(unsigned int* out, long long spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}

extern "C" __global__ void pdtop_fma(float* out, int iters) {
    float a = threadIdx.x * 1e-6f, b = a + 0.5f, c = a + 0.25f, d = a + 0.125f;
    #pragma unroll 8
    for (int i = 0; i < iters; ++i) {
        a = fmaf(a, 0.9999f, 1e-4f); b = fmaf(b, 0.9999f, 1e-4f);
        c = fmaf(c, 0.9999f, 1e-4f); d = fmaf(d, 0.9999f, 1e-4f);
    }
    if (a + b + c + d == -1.0f) out[0] = a;  // never true (all stay positive); keeps the loop, in bounds
}
"""
UNWRITTEN = 0xFFFFFFFF  # the smid buffer is filled with this before a launch
SMID_THREADS, SMID_BLOCKS_PER_SM, SPIN_CYCLES = 1024, 8, 20_000
FMA_THREADS, FMA_RESIDENT_PER_SM = 256, 8  # 8 blocks of 256 threads fill an SM (2,048 threads)
# 32 waves on the whole GPU: a part's last, partial wave costs at most 1/32 of its time (with 8 waves,
# 104 SMs timed as 96: 8448 blocks take 11 waves of 832 there against 8 of 1056)
FMA_BLOCKS_PER_SM = 32 * FMA_RESIDENT_PER_SM
TARGET_S = 0.004  # one timed launch on the whole device
ITERS_START, ITERS_MIN, ITERS_MAX = 2_000, 100, 2_000_000
REPEATS = 3


def load_nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise DeviceError("cuda.bindings.nvrtc is not installed: pip install 'pdtop[gpu]'") from None
    return nvrtc


def compile_cubin(major: int, minor: int, nvrtc: Any = None) -> bytes:
    """The probe kernels as a cubin for compute capability `major.minor` (NVRTC's log on failure)."""
    nvrtc = nvrtc if nvrtc is not None else load_nvrtc()
    prog = call(nvrtc, "nvrtcCreateProgram", SOURCE.encode(), b"pdtop_sm_probe.cu", 0, [], [])
    try:
        opts = [f"--gpu-architecture=sm_{major}{minor}".encode()]
        try:
            call(nvrtc, "nvrtcCompileProgram", prog, len(opts), opts)
        except DeviceError as e:
            raise DeviceError(f"{e}: {_log(nvrtc, prog)}") from None
        size = int(call(nvrtc, "nvrtcGetCUBINSize", prog))
        cubin = b" " * size
        call(nvrtc, "nvrtcGetCUBIN", prog, cubin)
        return cubin
    finally:
        call(nvrtc, "nvrtcDestroyProgram", prog)


def _log(nvrtc: Any, prog: Any) -> str:
    size = int(call(nvrtc, "nvrtcGetProgramLogSize", prog))
    text = b" " * size
    call(nvrtc, "nvrtcGetProgramLog", prog, text)
    lines = [ln for ln in text.decode(errors="replace").rstrip("\0 ").splitlines() if ln.strip()]
    return lines[0] if lines else "no log"


def distinct_sms(ids: Sequence[int]) -> set[int]:
    """The SM ids a launch's blocks recorded; DeviceError if any block wrote nothing (it did not run)."""
    missing = sum(1 for i in ids if i == UNWRITTEN)
    if missing:
        raise DeviceError(f"{missing} of {len(ids)} probe blocks recorded no SM id")
    return set(ids)


def timed_sms(total_sms: int, whole_s: float, stream_s: float) -> float:
    """SMs a stream behaves as having: a compute-bound launch takes `stream_s` there, `whole_s` on all."""
    if whole_s <= 0 or stream_s <= 0:
        raise DeviceError(f"probe times must be positive, got whole {whole_s} s, stream {stream_s} s")
    return round(total_sms * whole_s / stream_s, 1)


def scaled_iters(iters: int, measured_s: float, target_s: float = TARGET_S) -> int:
    """Iterations that make the timed launch take about `target_s`, bounded."""
    if measured_s <= 0:
        return ITERS_MAX
    return max(ITERS_MIN, min(ITERS_MAX, int(iters * target_s / measured_s)))


class SmProbe:
    """The probe kernels loaded on `gc`'s GPU, a device buffer and a whole-device stream; `close()`
    frees them. `clock` times launches (the fake driver's virtual clock in tests)."""

    def __init__(self, gc: GreenContexts, nvrtc: Any = None, clock: Callable[[], float] = time.perf_counter):
        self.drv, self.gc, self.clock = gc.drv, gc, clock
        self.total = gc.total_sms
        self.blocks = self.total * SMID_BLOCKS_PER_SM
        self._lib: Any = None
        self._buf: Any = None
        self._whole: Any = None
        cubin = compile_cubin(gc.major, gc.minor, nvrtc)
        image = ctypes.create_string_buffer(cubin, len(cubin))
        try:
            with self._current():
                self._lib = call(self.drv, "cuLibraryLoadData", ctypes.addressof(image), None, None, 0, None, None, 0)
                self._smid = call(self.drv, "cuLibraryGetKernel", self._lib, b"pdtop_smid")
                self._fma = call(self.drv, "cuLibraryGetKernel", self._lib, b"pdtop_fma")
                self._buf = call(self.drv, "cuMemAlloc", 4 * self.blocks)
                self._whole = call(self.drv, "cuStreamCreate", int(self.drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
            self.iters, self.whole_s = self._calibrate()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _current(self) -> Iterator[None]:
        call(self.drv, "cuCtxPushCurrent", self.gc.primary)
        try:
            yield
        finally:
            call(self.drv, "cuCtxPopCurrent")

    def _stream(self, handle: Any) -> Any:
        make = getattr(self.drv, "CUstream", None)
        return make(int(handle)) if make is not None else int(handle)

    def _launch(self, kernel: Any, blocks: int, threads: int, stream: Any, args: list[Any]) -> None:
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        call(self.drv, "cuLaunchKernel", kernel, blocks, 1, 1, threads, 1, 1, 0, stream,
             ctypes.addressof(params), 0)

    def smids(self, handle: Any) -> set[int]:
        """The distinct SMs a wide `%smid` launch on stream `handle` ran on."""
        stream = self._stream(handle)
        with self._current():
            call(self.drv, "cuMemsetD32Async", self._buf, UNWRITTEN, self.blocks, stream)
            self._launch(self._smid, self.blocks, SMID_THREADS, stream,
                         [ctypes.c_uint64(int(self._buf)), ctypes.c_longlong(SPIN_CYCLES)])
            call(self.drv, "cuStreamSynchronize", stream)
            host = (ctypes.c_uint32 * self.blocks)()
            call(self.drv, "cuMemcpyDtoH", ctypes.addressof(host), self._buf, 4 * self.blocks)
        return distinct_sms(list(host))

    def seconds(self, handle: Any, iters: int | None = None) -> float:
        """The best of `REPEATS` timings of the FMA launch on stream `handle` (after one warm-up)."""
        stream = self._stream(handle)
        args = [ctypes.c_uint64(int(self._buf)), ctypes.c_int(iters or self.iters)]
        best = float("inf")
        with self._current():
            for i in range(REPEATS + 1):
                t = self.clock()
                self._launch(self._fma, self.total * FMA_BLOCKS_PER_SM, FMA_THREADS, stream, args)
                call(self.drv, "cuStreamSynchronize", stream)
                if i:
                    best = min(best, self.clock() - t)
        return best

    def _calibrate(self) -> tuple[int, float]:
        iters = scaled_iters(ITERS_START, self.seconds(self._whole, ITERS_START))
        return iters, self.seconds(self._whole, iters)

    def measure(self, handle: Any) -> dict[str, Any]:
        """`smid_distinct`, `timed_sms` and the SM ids themselves (`smids`) for stream `handle`."""
        ids = self.smids(handle)
        return {"smid_distinct": len(ids), "timed_sms": timed_sms(self.total, self.whole_s, self.seconds(handle)),
                "smids": sorted(ids)}

    def close(self) -> None:
        """Free the buffer, the whole-device stream and the library; errors are raised after all three."""
        errors: list[str] = []
        with self._current():
            for name, handle in (("cuMemFree", self._buf), ("cuStreamDestroy", self._whole),
                                 ("cuLibraryUnload", self._lib)):
                if handle is not None:
                    try:
                        call(self.drv, name, handle)
                    except DeviceError as e:
                        errors.append(str(e))
        self._buf = self._whole = self._lib = None
        if errors:
            raise DeviceError("; ".join(errors))


Side = Any  # a raw stream handle, or None where that side has no SMs


def measure_levels(probe: SmProbe, levels: Sequence[tuple[Side, Side]], time_limit_s: float) -> list[dict | None]:
    """Per level, `{"prefill": ..., "decode": ..., "shared_smids": n}` (a side with no stream: None;
    `shared_smids`: SMs both sides ran on, None unless both were measured). Levels left when
    `time_limit_s` is spent are None."""
    deadline = probe.clock() + time_limit_s
    out: list[dict | None] = []
    for prefill, decode in levels:
        if probe.clock() > deadline:
            out.append(None)
            continue
        p, d = (None if h is None else probe.measure(h) for h in (prefill, decode))
        shared = None if p is None or d is None else len(set(p["smids"]) & set(d["smids"]))
        for side in (p, d):
            if side is not None:
                del side["smids"]
        sides = {"prefill": p, "decode": d}
        out.append({**sides, "shared_smids": shared})
    return out
