"""csrc/quant_k.c: Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. Every type on every path this machine can run (the
native build's fast and forced-portable paths, an AVX2/FMA-only build, a build without AVX) on odd
shapes against `gguf.quants.dequantize` + matmul (Q5: gguf-py's quantizer on random weights; K types:
random valid blocks), the embedding rows, and the dense path."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from pdtop.engine.model import cpu_kernels, quant_kernels
from pdtop.engine.model.quant_linear import QuantLinear, QuantWeight

TYPES = sorted(quant_kernels.MORE_TYPES)
IDS = [quant_kernels.QUANT_TYPES[t] for t in TYPES]
# (build, forced portable): the native build's two paths, then builds for other instruction sets
PATHS = [("native", True), ("native", False), ("avx2", False), ("portable", False)]


@pytest.fixture(scope="module", params=PATHS, ids=[f"{isa}{'-forced-portable' if p else ''}" for isa, p in PATHS])
def path(request) -> tuple[quant_kernels.QuantKernels, bool]:
    isa, portable = request.param
    if quant_kernels.kernels() is None or not cpu_kernels.isa_runs_here(isa):
        pytest.skip(f"no {isa} build of the quantized kernels here")
    k = quant_kernels.kernels() if isa == "native" else quant_kernels.kernels_for_isa(isa)
    if k is None or k.lib_k is None:
        pytest.skip(f"quant_k.c cannot be built for {isa} here")
    if not portable and isa != "portable" and k.fast_k == 0:
        pytest.skip(f"the {isa} build has no fast path on this CPU")
    if isa == "portable":
        assert k.fast_k == 0  # the baseline build is the portable path
    return k, portable


def shapes(qtype: int) -> list[tuple[int, int, int]]:
    """(out, in, rows): rows not a multiple of the tile (16) or of the row group (4), 1..9 activation
    rows, and in_f = 256 * k for the K types."""
    e = quant_kernels.block_len(qtype)
    odd = [(1, e, 1), (37, 3 * e, 1), (17, 6 * e if e == 256 else 19 * e, 3), (130, 2 * e, 9), (5, e, 70)]
    return odd + [(21, 2 * e, n) for n in range(1, 10)]


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_every_path_matches_dequantize_on_odd_shapes(path, qtype):
    k, portable = path
    for out_f, in_f, n in shapes(qtype):
        problem = quant_kernels.check(k, qtype, out_f, in_f, n, portable, seed=out_f + n)
        assert problem is None, (out_f, in_f, n, problem)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_paths_agree_and_rows_do_not_depend_on_the_batch(qtype):
    k = quant_kernels.kernels()
    if k is None or qtype not in k.types:
        pytest.skip("no quant_k kernels here")
    in_f = 2 * quant_kernels.block_len(qtype)
    w = torch.from_numpy(quant_kernels.random_blocks(qtype, 45, in_f, seed=1)[0])
    x = torch.randn(9, in_f, generator=torch.Generator().manual_seed(1))
    ys = [k.matmul(qtype, w, in_f, x, portable) for portable in (True, False)]
    assert torch.allclose(ys[1], ys[0], atol=1e-4 * float(ys[0].abs().max()))
    for portable, y in zip((True, False), ys, strict=True):
        lone = torch.cat([k.matmul(qtype, w, in_f, x[i:i + 1], portable) for i in range(9)])
        assert torch.equal(lone, y)  # each row's dots alone: sharing weight blocks changes nothing


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_the_activation_rounding_is_llama_cpps(qtype):
    """Q5: per 32 (Q8_0 / Q8_1); K: per 256 (Q8_K). The kernel equals dequantize(W) @ x rounded that
    way, and not rounded the other way (so the check would see a kernel rounding per the wrong block)."""
    k = quant_kernels.kernels()
    if k is None or qtype not in k.types:
        pytest.skip("no quant_k kernels here")
    block, in_f = quant_kernels.block_len(qtype), 512
    raw, dense = quant_kernels.random_blocks(qtype, 40, in_f, seed=7)
    # rows whose 32-blocks differ wildly in size: per-32 and per-256 rounding differ clearly
    sizes = torch.logspace(-2, 1, 16).repeat_interleave(32)
    x = torch.randn(3, in_f, generator=torch.Generator().manual_seed(7)) * sizes
    y = k.matmul(qtype, torch.from_numpy(raw), in_f, x)
    w = torch.from_numpy(dense)
    mine, other = (quant_kernels.round_activations(x, b) @ w.T for b in (block, 288 - block))
    scale = float(mine.abs().max())
    assert torch.allclose(y, mine, atol=quant_kernels.EXACT_TOL * scale, rtol=quant_kernels.EXACT_TOL)
    assert not torch.allclose(y, other, atol=quant_kernels.EXACT_TOL * scale, rtol=quant_kernels.EXACT_TOL)


def test_a_corrupt_layout_is_seen_by_the_check():
    """Q4_K's and Q5_K's bytes read as the other type (same scales, different quant bits) are wrong."""
    k = quant_kernels.kernels()
    if k is None or not {int(Q.Q4_K), int(Q.Q5_K)} <= k.types:
        pytest.skip("no quant_k kernels here")
    raw, dense = quant_kernels.random_blocks(int(Q.Q5_K), 20, 256, seed=8)
    as_q4 = np.concatenate([raw[:, :16], raw[:, 48:]], axis=1)  # Q5_K without its 5th bits is a Q4_K block
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(8))
    want = x @ torch.from_numpy(dense).T
    got = k.matmul(int(Q.Q4_K), torch.from_numpy(np.ascontiguousarray(as_q4)), 256, x)
    assert float((got - want).norm() / want.norm()) > 10 * quant_kernels.ROUNDING_TOL


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_embedding_rows_are_gguf_dequantize(path, qtype):
    k, _ = path
    in_f = 2 * quant_kernels.block_len(qtype)
    raw, dense = quant_kernels.random_blocks(qtype, 50, in_f, seed=3)
    ids = torch.tensor([49, 0, 7, 7, 3])
    assert torch.equal(k.rows(qtype, torch.from_numpy(raw), in_f, ids), torch.from_numpy(dense)[ids])
    if k is quant_kernels.kernels():
        weight = QuantWeight(torch.from_numpy(raw), qtype, in_f)
        assert torch.equal(weight.rows(ids.view(1, 5)), torch.from_numpy(dense)[ids].view(1, 5, in_f))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_dense_path_for_many_rows_matches_dequantize(qtype, monkeypatch):
    from pdtop.engine.model import quant_linear

    if quant_kernels.kernels() is None or qtype not in quant_kernels.kernels().types:
        pytest.skip("no quant_k kernels here")
    in_f = quant_kernels.block_len(qtype) * 2
    monkeypatch.setattr(quant_linear, "DENSE_SLICE", in_f * 7)  # several slices, the last one short
    raw, dense = quant_kernels.random_blocks(qtype, 30, in_f, seed=5)
    layer = QuantLinear(QuantWeight(torch.from_numpy(raw), qtype, in_f))
    assert layer.dense_rows is not None  # quant_k.c's types: per-row dots only, dense from some rows on
    x = torch.randn(layer.dense_rows + 3, in_f, generator=torch.Generator().manual_seed(6))
    want = x @ torch.from_numpy(dense).T
    assert torch.allclose(layer.forward(x), want, atol=1e-5 * float(want.abs().max()), rtol=1e-5)
    few = layer.forward(x[:3])  # the int8 dots: within their rounding of the float matmul
    assert float((few - want[:3]).norm() / want[:3].norm()) < quant_kernels.ROUNDING_TOL


def test_bad_shapes_are_refused_in_one_line():
    k = quant_kernels.kernels()
    if k is None or int(Q.Q6_K) not in k.types:
        pytest.skip("no quant_k kernels here")
    raw = torch.from_numpy(quant_kernels.random_blocks(int(Q.Q6_K), 4, 256, seed=9)[0])
    with pytest.raises(ValueError, match="Q6_K rows need in_features a multiple of 256, not 160"):
        k.matmul(int(Q.Q6_K), raw, 160, torch.zeros(1, 160))
    with pytest.raises(ValueError, match="no quantized kernel"):
        k.matmul(99, raw, 256, torch.zeros(1, 256))


def test_k_blocks_are_valid_and_refuse_bad_shapes():
    from gguf.quants import dequantize

    from pdtop.engine.model.k_blocks import random_k_blocks

    for qtype in quant_kernels.K_TYPES:
        dense = dequantize(random_k_blocks(qtype, 8, 512, seed=qtype), Q(qtype))
        assert dense.shape == (8, 512) and np.isfinite(dense).all() and 0.05 < float(np.abs(dense).mean()) < 5
    with pytest.raises(ValueError):
        random_k_blocks(int(Q.Q4_K), 2, 96, seed=0)


def test_the_new_type_numbers_are_ggufs():
    assert quant_kernels.MORE_TYPES == {int(getattr(Q, n)): n for n in ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")}
    assert [quant_kernels.block_len(t) for t in TYPES] == [32, 32, 256, 256, 256]
