"""The native CPU kernels (pdtop/engine/model/csrc/*.c) against torch, built for every instruction set
this CPU can run (`cpu_kernels.ISAS`: native, AVX2/FMA, portable) so the paths a CPU would not pick are
checked too, at sizes on both sides of each kernel's dispatch thresholds (head_dim a multiple of 32 or
not for decode attention's AVX2 task; PARALLEL_MIN for the team)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pdtop.engine.model import cpu_kernels
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.scheduling.tokens import append_token

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")


ISAS = [isa for isa in cpu_kernels.ISAS if cpu_kernels.isa_runs_here(isa)]


@pytest.fixture(scope="module", params=ISAS)
def isa(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def kernel(isa):
    k = cpu_kernels.decode_attention(isa)
    assert k is not None, f"a C compiler is here, yet the {isa} kernel did not build or disagreed with torch"
    return k


def test_each_instruction_set_builds_what_it_names(isa):
    """Forcing an instruction set forces its paths: portable has no AVX2 task, avx2 no AVX-512
    vectors, native what this CPU has."""
    got = cpu_kernels.compiled_features(isa)
    assert got is not None
    flags = set(cpu_kernels._cpu_id().split())
    want = {"portable": set(), "avx2": {"avx2"},
            "native": {f for f, need in (("avx2", {"avx2", "fma"}), ("avx512", {"avx512f"})) if need <= flags}}
    assert got == want[isa]


def softmax_attention(q, cache, slots, lens, scale):
    """Plain float64 attention of each row's query heads over its first lens[i] slots."""
    n, h, d = q.shape
    g = h // cache.shape[1]
    out = torch.empty(n, h, d, dtype=torch.float64)
    for i in range(n):
        idx = slots[i, : int(lens[i])]
        for a in range(h):
            k, v = cache[0, a // g, idx].double(), cache[1, a // g, idx].double()
            out[i, a] = torch.softmax(k @ q[i, a].double() * scale, 0) @ v
    return out


# keys x heads x head_dim over the 6 rows (989 keys) against PARALLEL_MIN (262144): (9,3,64) 570k parallel, AVX2
# task; (32,8,128) parallel, AVX2; (4,4,16) 63k serial, portable task (d not 32k); (16,1,32) parallel, AVX2;
# (4,2,32) 127k serial, AVX2; (6,2,48) 285k parallel, portable task
@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (32, 8, 128), (4, 4, 16), (16, 1, 32), (4, 2, 32), (6, 2, 48)])
def test_kernel_matches_softmax_attention(kernel, h, kvh, d):
    g = torch.Generator().manual_seed(h * d)
    S, n = 700, 6
    cache = torch.randn(2, kvh, S, d, generator=g)
    qkv = torch.randn(n, h + 2 * kvh, d, generator=g) * 3  # q sits inside the qkv rows: strided
    q = qkv[:, :h]
    lens = torch.tensor([1, 15, 16, 17, 300, 640])  # below, at and past the kernel's 16-key blocks
    L = int(lens.max())
    slots = torch.stack([torch.randperm(S, generator=g)[:L] for _ in range(n)])
    assert cpu_kernels.supports(q, cache)
    got = kernel(q, cache, slots, lens, d ** -0.5)
    assert (got.double() - softmax_attention(q, cache, slots, lens, d ** -0.5)).abs().max() < 1e-4


def test_kernel_refuses_what_it_does_not_take():
    cache = torch.zeros(2, 2, 8, 64)
    assert not cpu_kernels.supports(torch.zeros(1, 4, 64, dtype=torch.bfloat16), cache.bfloat16())
    assert not cpu_kernels.supports(torch.zeros(1, 4, 72), torch.zeros(2, 2, 8, 72))  # head_dim not 16k
    assert not cpu_kernels.supports(torch.zeros(1, 4, 256), torch.zeros(2, 2, 8, 256))  # head_dim > 128
    assert not cpu_kernels.supports(torch.zeros(1, 64, 64), cache)  # 32 query heads per KV head


def test_model_decode_through_the_kernel_matches_prefill_of_the_same_tokens(runner, tokenizer):
    """Decode steps of the real model (attention by the kernel) give the logits a whole-sequence
    prefill (attention by torch's SDPA) gives at the same positions."""
    assert cpu_kernels.decode_attention() is not None
    r = runner()
    texts = ["The capital of France is", "def fibonacci(n):\n    " * 6, "A" + " long story" * 40]
    reqs = [Request(i, tokenizer.encode(t), SamplingParams(max_tokens=8, ignore_eos=True)) for i, t in enumerate(texts)]
    for q in reqs:
        r.admit(q)
    for q, t in zip(reqs, r.prefill(reqs), strict=True):
        append_token(q, t, 0.0, [])
    for _ in range(3):
        for q, t in zip(reqs, r.decode(reqs), strict=True):
            append_token(q, t, 0.0, [])
    decoded = r.next_logits(reqs)
    fresh = runner()
    for i, q in enumerate(reqs):
        whole = Request(100 + i, q.prompt_ids + q.output_ids, SamplingParams(max_tokens=1))
        fresh.admit(whole)
        state = fresh.prefill_begin([whole])
        fresh.prefill_layers(state, 0, fresh.model.num_layers)
        fresh.prefill_finish(state)
        assert (state.logits[0] - decoded[i]).abs().max() < 1e-3
        fresh.free(whole)


@pytest.mark.parametrize("rows,f", [(1, 16), (32, 1536), (200, 1536)])  # the last: over the parallel threshold
def test_swiglu_kernel_matches_torch(isa, rows, f):
    act = cpu_kernels.silu_mul(isa)
    assert act is not None
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * f, generator=g) * 8
    x[0, :4] = torch.tensor([0.0, -0.0, -200.0, 200.0])  # zeros, exp underflow, saturation
    want = torch.nn.functional.silu(x[:, :f].double()) * x[:, f:].double()
    assert (act(x).double() - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 15), (5, 49152), (32, 1000)])
def test_argmax_kernel_is_torchs_argmax_with_its_ties_and_nans(isa, rows, vocab):
    first_max = cpu_kernels.argmax(isa)
    assert first_max is not None
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(rows, vocab + 3, generator=g)[:, 2:-1]  # rows apart by more than their length
    x[0, -1] = 50.0  # the last position
    if rows > 2:
        x[1, vocab // 3] = x[1, vocab // 2] = 50.0  # a tie: the first
        x[2] = -0.0
        x[2, vocab - 1] = 0.0  # equal to -0.0: the first
    if rows > 4:
        x[3, vocab - 7] = x[3, vocab - 2] = float("nan")  # the first NaN, past the maximum
        x[4] = float("-inf")
    assert torch.equal(first_max(x), x.argmax(-1))


@pytest.mark.parametrize("rows,dim", [(1, 16), (32, 576), (600, 576)])  # the last: over the parallel threshold
def test_rms_norm_kernel_matches_torch_with_and_without_the_residual_add(isa, rows, dim):
    norm = cpu_kernels.add_rms_norm(isa)
    assert norm is not None
    g = torch.Generator().manual_seed(rows)
    x, d, w = torch.randn(rows, dim, generator=g) * 5, torch.randn(rows, dim, generator=g), torch.rand(dim, generator=g)
    out, s = norm(x, d, w, 1e-6)
    assert s is not None and torch.equal(s, x + d)
    want = torch.nn.functional.rms_norm((x + d).double(), (dim,), w.double(), 1e-6)
    assert (out.double() - want).abs().max() < 1e-5
    alone, none = norm(x, None, w, 1e-6)
    assert none is None
    assert (alone.double() - torch.nn.functional.rms_norm(x.double(), (dim,), w.double(), 1e-6)).abs().max() < 1e-5


@pytest.mark.parametrize("rows,h,kvh,d", [(1, 9, 3, 64), (32, 9, 3, 64), (700, 8, 2, 128)])  # the last: parallel
def test_rope_kv_kernel_matches_torch_rope_and_cache_write(isa, rows, h, kvh, d):
    """RoPE on the q and k heads in place and k/v written to each row's slot: what `rope_` and
    `index_copy_` do, on qkv rows with a stride (a view of a wider matrix), leaving other slots alone."""
    rope_kv = cpu_kernels.rope_kv(isa)
    assert rope_kv is not None
    g = torch.Generator().manual_seed(rows)
    S, width = 1024, (h + 2 * kvh) * d
    wide = torch.randn(rows, width + 16, generator=g)
    qkv, pad = wide[:, :width], wide[:, width:].clone()
    positions = torch.randint(0, 4000, (rows,), generator=g).float()
    freqs = positions[:, None] * (10000.0 ** (-torch.arange(0, d, 2).float() / d))[None, :]
    rot = torch.polar(torch.ones_like(freqs), freqs)[:, None, :]
    slots = torch.randperm(S, generator=g)[:rows]
    cache = torch.randn(2, kvh, S, d, generator=g)
    want, want_cache = qkv.double().clone(), cache.double().clone()
    pairs = torch.view_as_complex(want[:, : (h + kvh) * d].reshape(rows, h + kvh, d // 2, 2).contiguous())
    want[:, : (h + kvh) * d] = torch.view_as_real(pairs * rot.to(torch.complex128)).reshape(rows, -1)
    want_cache.index_copy_(2, slots, want[:, h * d:].view(rows, 2, kvh, d).permute(1, 2, 0, 3))
    rope_kv(qkv, rot, cache, slots, h, kvh)
    assert (qkv.double() - want).abs().max() < 1e-4
    assert (cache.double() - want_cache).abs().max() < 1e-4
    assert torch.equal(wide[:, width:], pad)


def test_rope_kv_refuses_what_it_does_not_take():
    qkv, cache, slots = torch.zeros(4, 15 * 64), torch.zeros(2, 3, 32, 64), torch.arange(4)
    rot = torch.polar(torch.ones(4, 1, 32), torch.zeros(4, 1, 32))
    assert cpu_kernels.fits_rope_kv(qkv, rot, cache, slots)
    assert not cpu_kernels.fits_rope_kv(qkv.bfloat16(), rot, cache, slots)
    assert not cpu_kernels.fits_rope_kv(qkv, rot[:, :, :16].contiguous(), cache, slots)  # half the head rotated
    assert not cpu_kernels.fits_rope_kv(qkv, rot[:2], cache, slots)  # not one rotation per row
    assert not cpu_kernels.fits_rope_kv(qkv, rot, cache.transpose(2, 3), slots)
    assert not cpu_kernels.fits_rope_kv(qkv, rot, cache, slots.int())


KERNELS = (cpu_kernels.decode_attention, cpu_kernels.silu_mul, cpu_kernels.rope_kv, cpu_kernels.add_rms_norm,
           cpu_kernels.argmax)


def decode_logits(r, tokenizer) -> torch.Tensor:
    """Next-token logits after a prefill and three decode steps of two prompts."""
    reqs = [Request(i, tokenizer.encode(t), SamplingParams(max_tokens=8, ignore_eos=True))
            for i, t in enumerate(["The capital of France is", "def fibonacci(n):\n    " * 4])]
    for q in reqs:
        r.admit(q)
    for q, t in zip(reqs, r.prefill(reqs), strict=True):
        append_token(q, t, 0.0, [])
    for _ in range(3):
        for q, t in zip(reqs, r.decode(reqs), strict=True):
            append_token(q, t, 0.0, [])
    return r.next_logits(reqs)


def test_no_kernels_runs_the_torch_path_and_answers_the_same(monkeypatch, runner, tokenizer):
    """PDTOP_NO_KERNELS=1 turns every kernel off; the model then runs torch's RMSNorm, RoPE with
    index_copy_, SwiGLU and SDPA decode, and gives the kernels' logits."""
    assert all(k() is not None for k in KERNELS)
    with_kernels = decode_logits(runner(), tokenizer)
    monkeypatch.setenv("PDTOP_NO_KERNELS", "1")
    try:
        for k in (cpu_kernels._library, *KERNELS):
            k.cache_clear()
        assert all(k() is None for k in KERNELS) and not cpu_kernels.prepare()
        without = decode_logits(runner(), tokenizer)
    finally:
        monkeypatch.undo()
        for k in (cpu_kernels._library, *KERNELS):
            k.cache_clear()
    assert (with_kernels - without).abs().max() < 1e-3
    assert torch.equal(with_kernels.argmax(1), without.argmax(1))


def prepare_in_subprocess(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "from pdtop.engine.model import cpu_kernels as k; print(k.prepare(), k.prepare())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


def test_a_first_build_is_said_once_and_a_cached_one_not_at_all(tmp_path):
    """Issue 25 item 17: the first build says so on stderr, once; later processes find the cache."""
    env = {"XDG_CACHE_HOME": str(tmp_path), "PDTOP_KERNEL_ISA": "native"}
    first = prepare_in_subprocess(env)
    assert first.stdout.split() == ["True", "True"], first.stderr
    lines = first.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdtop: compiling the CPU kernels with"), lines
    again = prepare_in_subprocess(env)
    assert again.stdout.split() == ["True", "True"] and again.stderr == ""


def test_without_a_compiler_one_line_says_why_and_the_torch_path_runs(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": str(tmp_path), "CC": ""}
    done = prepare_in_subprocess(env)
    assert done.stdout.split() == ["False", "False"], done.stderr
    assert done.stderr.splitlines() == [
        "pdtop: CPU kernels unavailable: no C compiler (install gcc, or set CC); the slower torch path runs"]
    broken = prepare_in_subprocess({"XDG_CACHE_HOME": str(tmp_path), "CC": str(tmp_path / "no-such-cc")})
    assert broken.stdout.split() == ["False", "False"]
    lines = broken.stderr.splitlines()
    assert len(lines) == 1 and "does not run" in lines[0] and "the slower torch path runs" in lines[0], lines


def test_the_install_step_builds_every_kernel_source(tmp_path):
    """Issue 42 item 18: `make install` built 5 of the 8 libraries, so the first `generate` compiled the
    quantized matmuls and the decode step. `python -m pdtop.engine.model.cpu_kernels` now asks for
    every `csrc/*.c`: here through a compiler that logs each source and fails, so it is quick."""
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in *.c) echo "$a" >> {log};; esac; done\n'
                  'case "$1" in --version) echo "logging cc 1.0"; exit 0;; esac\nexit 1\n')
    cc.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "pdtop.engine.model.cpu_kernels"], capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CC": str(cc)}, timeout=120)
    assert done.returncode == 0, done.stderr
    sources = sorted(p.name for p in cpu_kernels.CSRC.glob("*.c"))
    assert len(sources) >= 9
    assert sorted({Path(line).name for line in log.read_text().split()}) == sources
    assert done.stdout.startswith("CPU kernels unavailable (") and "torch path runs" in done.stdout
