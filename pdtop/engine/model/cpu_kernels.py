"""Native CPU kernels (`csrc/*.c`), built on first use with the C compiler and loaded with ctypes.

Decode attention over the paged KV cache (`csrc/decode_attention.c`), 2-3x faster than
gathering each row's context and calling SDPA (the gather copies the whole context every
layer); SwiGLU's `silu(gate) * up` (`csrc/silu_mul.c`), RMSNorm after the residual add
(`csrc/rms_norm.c`), RoPE with the K/V cache write (`csrc/rope_kv.c`) and greedy decoding's argmax
(`csrc/argmax.c`) in one pass each; and `pin_team`
(`csrc/omp_team.c`), which pins a thread's OpenMP team to its cores.
Building takes about half a second each (plain C, no torch headers) and the libraries are
cached under `~/.cache/pdtop/kernels`, keyed by the source, the compiler and this CPU; the first
build says so once on stderr (`prepare`, called when a model is loaded on the CPU). They are
compiled with `-fopenmp` for an instruction set (`ISAS`; `PDTOP_KERNEL_ISA`, default `native`:
`-march=native`, AVX-512 where the CPU has it), linked to the OpenMP runtime torch already
loaded (libgomp), so a kernel's team is the calling thread's torch thread count. Each kernel is
checked once against torch when it loads; anything missing or wrong (no compiler, another OpenMP
runtime, a mismatch) means `None` (or False), one line on stderr says why, and the torch path
runs, as without the kernels. `PDTOP_NO_KERNELS=1` turns them off (for comparisons). Every kernel
function takes `isa=` so tests build and check each instruction set this CPU can run, not only
the one it would pick.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CSRC = Path(__file__).with_name("csrc")
FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
# instruction set -> compiler flags: what -march=native picks here; AVX2 with FMA and F16C (the C
# sources' AVX2 paths, 16-float vectors as two registers; quant.c's reads halves with F16C, which
# every AVX2 CPU has); the compiler's baseline (no AVX: the portable paths)
ISAS = {"native": ["-march=native"], "avx2": ["-mavx2", "-mfma", "-mf16c"], "portable": []}
_ISA_NEEDS = {"avx2": ("avx2", "fma", "f16c")}  # /proc/cpuinfo flags a build needs to run here
DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
_lock = threading.Lock()


def _torch_libgomp() -> str | None:
    """The libgomp torch runs on, as mapped in this process (None if torch uses another runtime)."""
    torch.get_num_threads()  # make sure torch's OpenMP runtime is loaded
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "/libgomp" in line}
    return min(paths) if len(paths) == 1 else None


def _cpu_id() -> str:
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def default_isa() -> str:
    isa = os.environ.get("PDTOP_KERNEL_ISA", "native")
    return isa if isa in ISAS else "native"


def isa_runs_here(isa: str) -> bool:
    """Whether code built for `isa` can run on this CPU (native and portable always can)."""
    flags = set(_cpu_id().split())
    return isa in ISAS and all(f in flags for f in _ISA_NEEDS.get(isa, ()))


class KernelUnavailable(Exception):
    """Why the kernels cannot be built or loaded here (one line)."""


_said: set[str] = set()


def _say_once(text: str) -> None:
    """One line on stderr, once per process (the kernels are many; the reason is one)."""
    if text not in _said:
        _said.add(text)
        print(f"pdtop: {text}", file=sys.stderr, flush=True)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdtop" / "kernels"


def _build(source: Path, gomp: str, isa: str) -> Path:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise KernelUnavailable("no C compiler (install gcc, or set CC)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise KernelUnavailable(f"the C compiler {cc!r} does not run ({exc})") from exc
    flags = [*FLAGS, *ISAS[isa]]
    texts = [source.read_text(), *(h.read_text() for h in sorted(CSRC.glob("*.h")))]
    key = hashlib.sha256("\0".join([*texts, *flags, gomp, version, _cpu_id()]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    out = cache / f"{source.stem}-{isa}-{key}.so"
    if not out.exists():
        _say_once(f"compiling the CPU kernels with {Path(cc).name} (once for this CPU and compiler; "
                  f"cached in {cache})")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then renamed: safe if two build at once
            part = Path(tmp) / out.name
            gomp_dir = str(Path(gomp).parent)
            done = subprocess.run([cc, *flags, str(source), "-o", str(part), gomp, f"-Wl,-rpath,{gomp_dir}"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                first = next((x for x in done.stderr.splitlines() if "error" in x), done.stderr.strip()[:200])
                raise KernelUnavailable(f"{Path(cc).name} failed on {source.name}: {first.strip()}")
            os.replace(part, out)
    return out


def _reference(q: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    n, h, d = q.shape
    kvh = cache.shape[1]
    outs = []
    for i in range(n):
        idx = slots[i, : int(lens[i])]
        k = cache[0][:, idx].repeat_interleave(h // kvh, 0)
        v = cache[1][:, idx].repeat_interleave(h // kvh, 0)
        outs.append(torch.softmax(q[i, :, None] @ k.transpose(1, 2) * scale, -1) @ v)
    return torch.cat(outs, 1).transpose(0, 1).reshape(n, h, d)


@functools.cache
def _library(name: str, isa: str | None = None) -> ctypes.CDLL | None:
    """`csrc/{name}.c` built for `isa` (default `default_isa()`), or found in the cache, and loaded;
    None when it cannot be (said once on stderr: the slower torch path runs)."""
    if os.environ.get("PDTOP_NO_KERNELS"):
        return None
    isa = isa or default_isa()
    if not isa_runs_here(isa):
        return None
    with _lock:
        try:
            gomp = _torch_libgomp()
            if gomp is None:
                raise KernelUnavailable("torch does not run on libgomp here, the OpenMP runtime they link to")
            return ctypes.CDLL(str(_build(CSRC / f"{name}.c", gomp, isa)))
        except (OSError, KernelUnavailable) as exc:
            _say_once(f"CPU kernels unavailable: {exc}; the slower torch path runs")
            return None


def _c_function(library: str, symbol: str, argtypes: list[Any], isa: str | None) -> Any:
    """`symbol` of `csrc/{library}.c`, a function returning nothing, with its argument types set; None
    when the library is unavailable."""
    lib = _library(library, isa)
    if lib is None:
        return None
    fn = getattr(lib, symbol)
    fn.restype = None
    fn.argtypes = argtypes
    return fn


@functools.cache
def decode_attention(isa: str | None = None) -> DecodeAttention | None:
    """`f(q [n, h, d] (rows may be strided), cache [2, kvh, S, d], slots [n, L] int64, lens [n] int64, scale)`
    -> `[n, h, d]`: each row's attention over its first `lens[i]` slots; None when the kernel is unavailable."""
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = _c_function("decode_attention", "pdtop_decode_attention_f32",
                     [ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float], isa)
    if fn is None:
        return None

    def attend(q: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor,
               scale: float) -> torch.Tensor:
        n, h, d = q.shape
        out = torch.empty(n, h, d, dtype=q.dtype)
        fn(q.data_ptr(), q.stride(0), cache.data_ptr(), slots.data_ptr(), lens.data_ptr(), out.data_ptr(),
           n, h, cache.shape[1], d, cache.shape[2], slots.shape[1], scale)
        return out

    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 3, 100, 64, generator=g)
    q = torch.randn(5, 13, 64, generator=g)[:, 2:11]  # strided rows, as q sits inside the qkv output
    slots = torch.randint(0, 100, (5, 40), generator=g)
    lens = torch.tensor([1, 17, 40, 16, 33])
    if not torch.allclose(attend(q, cache, slots, lens, 0.125), _reference(q, cache, slots, lens, 0.125),
                          atol=1e-5, rtol=1e-4):
        _say_once("the CPU decode-attention kernel disagrees with torch here; the slower torch path runs")
        return None
    return attend


@functools.cache
def silu_mul(isa: str | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """`f(x [n, 2f] float32, rows contiguous, f a multiple of 16)` -> `silu(x[:, :f]) * x[:, f:]`
    (`[n, f]`); None when the kernel is unavailable."""
    fn = _c_function("silu_mul", "pdtop_silu_mul_f32",
                     [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], isa)
    if fn is None:
        return None

    def act(x: torch.Tensor) -> torch.Tensor:
        n, f = x.shape[0], x.shape[1] // 2
        out = torch.empty(n, f, dtype=x.dtype)
        fn(x.data_ptr(), x.stride(0), out.data_ptr(), n, f)
        return out

    x = torch.randn(37, 96, generator=torch.Generator().manual_seed(0)) * 6
    if not torch.allclose(act(x), torch.nn.functional.silu(x[:, :48]) * x[:, 48:], atol=1e-5, rtol=1e-5):
        _say_once("the CPU SwiGLU kernel disagrees with torch here; the slower torch path runs")
        return None
    return act


RopeKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int], None]


@functools.cache
def rope_kv(isa: str | None = None) -> RopeKV | None:
    """`f(qkv [t, (h + 2 kvh) d], rot [t, 1, d/2] complex64, cache [2, kvh, S, d], slots [t] int64, h, kvh)`:
    RoPE on the q and k heads of `qkv` in place (adjacent pairs), then each row's k and v written to
    `cache` at its slot; float32, rows contiguous. None when the kernel is unavailable."""
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = _c_function("rope_kv", "pdtop_rope_kv_f32", [ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, i64], isa)
    if fn is None:
        return None

    def apply(qkv: torch.Tensor, rot: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, h: int, kvh: int) -> None:
        fn(qkv.data_ptr(), qkv.stride(0), rot.data_ptr(), cache.data_ptr(), slots.data_ptr(), qkv.shape[0],
           h, kvh, cache.shape[3], cache.shape[2])

    g = torch.Generator().manual_seed(0)
    h, kvh, d, t, S = 6, 2, 32, 5, 40
    qkv = torch.randn(t, (h + 2 * kvh) * d, generator=g)
    rot = torch.polar(torch.ones(t, 1, d // 2), torch.rand(t, 1, d // 2, generator=g) * 6)
    slots = torch.randperm(S, generator=g)[:t]
    cache, want_cache, want = torch.zeros(2, kvh, S, d), torch.zeros(2, kvh, S, d), qkv.clone()
    qk = want[:, : (h + kvh) * d].view(t, h + kvh, d // 2, 2)
    qk.copy_(torch.view_as_real(torch.view_as_complex(qk) * rot))
    want_cache.index_copy_(2, slots, want[:, h * d:].view(t, 2, kvh, d).permute(1, 2, 0, 3))
    apply(qkv, rot, cache, slots, h, kvh)
    if not (torch.allclose(qkv, want, atol=1e-5) and torch.allclose(cache, want_cache, atol=1e-5)):
        _say_once("the CPU RoPE/KV-write kernel disagrees with torch here; the slower torch path runs")
        return None
    return apply


AddRmsNorm = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, float],
                      tuple[torch.Tensor, "torch.Tensor | None"]]


@functools.cache
def add_rms_norm(isa: str | None = None) -> AddRmsNorm | None:
    """`f(x [n, dim], delta [n, dim] or None, w [dim], eps)` -> `(rmsnorm(s) * w, s)` with `s = x + delta`
    (`None` for s without delta); float32, rows contiguous, dim a multiple of 16. None when unavailable."""
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = _c_function("rms_norm", "pdtop_add_rms_norm_f32", [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float], isa)
    if fn is None:
        return None

    def norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.empty_like(x)
        s = torch.empty_like(x) if delta is not None else None
        fn(x.data_ptr(), delta.data_ptr() if delta is not None else None, s.data_ptr() if s is not None else None,
           w.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out, s

    g = torch.Generator().manual_seed(0)
    x, d, w = torch.randn(7, 48, generator=g), torch.randn(7, 48, generator=g), torch.rand(48, generator=g)
    out, s = norm(x, d, w, 1e-5)
    want = torch.nn.functional.rms_norm(x + d, (48,), w, 1e-5)
    if s is None or not (torch.allclose(out, want, atol=1e-5) and torch.equal(s, x + d)):
        _say_once("the CPU RMSNorm kernel disagrees with torch here; the slower torch path runs")
        return None
    return norm


@functools.cache
def argmax(isa: str | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """`f(x [n, vocab] float32, rows contiguous, vocab >= 1)` -> `x.argmax(-1)` (the first index of
    each row's maximum, or of its first NaN), on the calling thread; None when unavailable."""
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = _c_function("argmax", "pdtop_argmax_f32", [ptr, i64, i64, i64, ptr], isa)
    if fn is None:
        return None

    def first_max(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], dtype=torch.int64)
        fn(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr())
        return out

    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    x[1, 7] = x[1, 900] = 100.0  # a tie: the first index
    x[2, 300] = x[2, 995] = float("nan")  # NaN wins, the first one
    x[3] = 1.0  # all equal
    x[4, -1] = 100.0  # in the tail past the last 16
    x[5, 0] = float("nan")
    if not torch.equal(first_max(x), x.argmax(-1)) or not torch.equal(first_max(x[:, :5]), x[:, :5].argmax(-1)):
        _say_once("the CPU argmax kernel disagrees with torch here; the slower torch path runs")
        return None
    return first_max


def fits_rope_kv(qkv: torch.Tensor, rot: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> bool:
    """Whether `rope_kv` takes these: float32 CPU tensors, qkv rows contiguous, rot complex64 with
    one rotation per row over the whole head, the cache and slots contiguous."""
    return (qkv.dtype == torch.float32 and qkv.is_cpu and qkv.dim() == 2 and qkv.stride(1) == 1
            and rot.dtype == torch.complex64 and rot.is_contiguous() and rot.shape[0] == qkv.shape[0]
            and 2 * rot.shape[-1] == cache.shape[3]
            and cache.dtype == torch.float32 and cache.is_contiguous() and slots.dtype == torch.int64
            and slots.is_contiguous())


def fits_rows(*ts: torch.Tensor) -> bool:
    """Whether the row kernels (`silu_mul`, `add_rms_norm`) take these: contiguous float32 CPU matrices."""
    return all(t.dim() == 2 and t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() for t in ts)


def pin_team(cores: tuple[int, ...]) -> bool:
    """Pin every thread of the calling thread's OpenMP team (its `torch.get_num_threads()` threads)
    to `cores`, as the calling thread itself is; False when that could not be done."""
    lib = _library("omp_team")
    if lib is None:
        return False
    return lib.pdtop_pin_team((ctypes.c_int32 * len(cores))(*cores), len(cores), torch.get_num_threads()) == 0


def supports(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes (float32 on the CPU, head_dim a multiple of 16 up to 128,
    up to 16 query heads per KV head, q rows contiguous within a row)."""
    _, h, d = q.shape
    return (q.dtype == torch.float32 and cache.dtype == torch.float32 and q.device.type == "cpu"
            and d % 16 == 0 and d <= 128 and h // cache.shape[1] <= 16 and q.stride(2) == 1 and q.stride(1) == d
            and cache.is_contiguous())


def compiled_features(isa: str | None = None) -> set[str] | None:
    """What the decode-attention build for `isa` compiled in ({"avx2", "avx512"} or fewer); None when
    it is unavailable. Tests check with it that forcing an instruction set forced its paths."""
    lib = _library("decode_attention", isa)
    if lib is None:
        return None
    bits = int(lib.pdtop_decode_attention_isa())
    return {name for bit, name in ((1, "avx2"), (2, "avx512")) if bits & bit}


# a kernel's checking function -> its library and C function
_ENTRIES: dict[Callable[..., Any], tuple[str, str]] = {
    decode_attention: ("decode_attention", "pdtop_decode_attention_f32"), silu_mul: ("silu_mul", "pdtop_silu_mul_f32"),
    rope_kv: ("rope_kv", "pdtop_rope_kv_f32"), add_rms_norm: ("rms_norm", "pdtop_add_rms_norm_f32")}


def c_entry(kernel: Callable[..., Any], isa: str | None = None) -> Any:
    """The ctypes function behind `kernel` (one of `decode_attention`, `silu_mul`, `rope_kv`,
    `add_rms_norm`), its argument types set, for callers that pass pointers themselves
    (`cpu_decode`); None where that kernel is unavailable or failed its check."""
    if kernel(isa) is None:
        return None
    library, symbol = _ENTRIES[kernel]
    lib = _library(library, isa)
    return None if lib is None else getattr(lib, symbol)


def prepare() -> bool:
    """Build (or find) and check every kernel now, so a first build is said and done while a model
    loads rather than inside its first forward pass; whether they all are ready."""
    return all(k() is not None for k in (decode_attention, silu_mul, rope_kv, add_rms_norm, argmax))


def build_all() -> list[str]:
    """Build (or find in the cache) every `csrc/*.c` for this CPU, the quantized matmuls and the decode
    step included, so no later model load compiles; the names that could not be built."""
    return [source.stem for source in sorted(CSRC.glob("*.c")) if _library(source.stem) is None]


if __name__ == "__main__":  # `python -m pdtop.engine.model.cpu_kernels`: build them all now (`make install` does)
    missing, total = build_all(), len(list(CSRC.glob("*.c")))
    if missing or not prepare():
        print(f"CPU kernels unavailable ({', '.join(missing) or 'a check failed'}): the torch path runs there")
    else:
        print(f"CPU kernels ready: {total} of {total} built for this CPU")
