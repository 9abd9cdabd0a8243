"""Triton kernels for decode attention straight from the paged KV cache (flash-decoding).

One program per (decode row, KV head, context split) loads that KV head's query heads as
one tile, walks its split of the row's context through the block table (no gathered copy),
and keeps an online softmax; a second kernel merges the splits by their log-sum-exp. The
split count is a launch constant chosen from the batch size, so a CUDA graph captures the
launch and the context length is read on the GPU. The block table's width (its row stride), which
an eager batch takes from its longest row, is not a specialization key: Triton would otherwise
compile again whenever the width crossed a multiple of 16 (seconds, in the middle of a timed run),
and a variant is fixed by the head shape, dtype and split count alone (`bench/gpu_warm.py`
compiles them ahead).

Imported only when the kernels run (Triton ships with CUDA builds of torch). Under
`TRITON_INTERPRET=1` they run on CPU tensors, which the tests use; there (`interpret`) the
products are float32 (the interpreter has no bfloat16 one) and the context loop is a
`while` (the interpreter cannot take a loaded value as a `range` bound); the tile's
arithmetic (`_tile`) is the same code either way.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _tile(q, k_base, v_base, bt_row, s, end, m, l_sum, acc, scale, stride_ks, stride_vs, d, dmask,
          BLOCK_N: tl.constexpr, PAGE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """One BLOCK_N tile of context positions [s, s + BLOCK_N) (< end): online-softmax update."""
    pos = s + tl.arange(0, BLOCK_N)
    nmask = pos < end
    page = tl.load(bt_row + pos // PAGE, mask=nmask, other=0)
    slot = (page * PAGE + pos % PAGE).to(tl.int64)
    kvmask = nmask[:, None] & dmask[None, :]
    k = tl.load(k_base + slot[:, None] * stride_ks + d[None, :], mask=kvmask, other=0.0)
    v = tl.load(v_base + slot[:, None] * stride_vs + d[None, :], mask=kvmask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    qk = tl.where(nmask[None, :], qk * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_sum, acc * alpha[:, None] + pv


@triton.jit(do_not_specialize=["stride_bt"])  # the table's width varies with the batch: one compile for all
def _decode_split(Q, K, V, BT, CTX, MID_O, MID_LSE, OUT, scale,
                  stride_qn, stride_qh, stride_kh, stride_ks, stride_vh, stride_vs, stride_bt,
                  stride_mn, stride_mh, stride_ms, stride_on, stride_oh,
                  G: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr,
                  UPCAST: tl.constexpr, IEEE: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CTX + row)
    per_split = tl.cdiv(ctx, SPLITS)
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    hs = tl.arange(0, BLOCK_H)
    heads = kv_head * G + hs
    hmask = hs < G
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(Q + row * stride_qn + heads[:, None] * stride_qh + d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    k_base = K + kv_head * stride_kh
    v_base = V + kv_head * stride_vh
    bt_row = BT + row * stride_bt
    if INTERPRET:  # the interpreter (numpy 2) cannot take a loaded value as a range() bound
        s = start
        while s < end:
            m, l_sum, acc = _tile(q, k_base, v_base, bt_row, s, end, m, l_sum, acc, scale, stride_ks, stride_vs,
                                  d, dmask, BLOCK_N, PAGE, UPCAST, IEEE)
            s += BLOCK_N
    else:
        for s in range(start, end, BLOCK_N):
            m, l_sum, acc = _tile(q, k_base, v_base, bt_row, s, end, m, l_sum, acc, scale, stride_ks, stride_vs,
                                  d, dmask, BLOCK_N, PAGE, UPCAST, IEEE)

    o = acc / tl.maximum(l_sum, 1e-30)[:, None]
    if SPLITS == 1:  # nothing to merge: write the output directly
        tl.store(OUT + row * stride_on + heads[:, None] * stride_oh + d[None, :],
                 o.to(OUT.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])
    else:
        mid = row * stride_mn + heads * stride_mh + split * stride_ms
        tl.store(MID_O + mid[:, None] * BLOCK_D + d[None, :], o, mask=hmask[:, None] & dmask[None, :])
        tl.store(MID_LSE + mid, m + tl.log(l_sum), mask=hmask)  # an empty split: -inf, weight 0


@triton.jit
def _decode_merge(MID_O, MID_LSE, OUT, stride_mn, stride_mh, stride_ms, stride_on, stride_oh,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < SPLITS
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    mid = row * stride_mn + head * stride_mh + s * stride_ms
    lse = tl.load(MID_LSE + mid, mask=smask, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))
    o = tl.load(MID_O + mid[:, None] * BLOCK_D + d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(OUT + row * stride_on + head * stride_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)


def launch(q: Tensor, k: Tensor, v: Tensor, block_table: Tensor, context_lens: Tensor, out: Tensor, mid_o: Tensor,
           mid_lse: Tensor, scale: float, page: int, splits: int, interpret: bool = False) -> None:
    """q `[n, h, d]`, k and v `[kv_heads, slots, d]` (one layer), block_table `[n, W]` int32,
    context_lens `[n]` int32 (>= 1), out `[n, h, d]`; mid_o `[n, h, splits, BLOCK_D]` and mid_lse
    `[n, h, splits]` float32 scratch (unused with one split)."""
    n, h, dim = q.shape
    kvh = k.shape[0]
    group = h // kvh
    block_d = triton.next_power_of_2(dim)
    block_h = max(16, triton.next_power_of_2(group))
    block_n = 64 if block_d <= 128 else 32
    upcast = interpret and q.dtype.itemsize == 2  # the interpreter multiplies no 16-bit matrices
    ieee = q.dtype.itemsize == 4 and not interpret
    _decode_split[(n, kvh, splits)](
        q, k, v, block_table, context_lens, mid_o, mid_lse, out, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), block_table.stride(0),
        h * splits, splits, 1, out.stride(0), out.stride(1),
        G=group, D=dim, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n, PAGE=page, SPLITS=splits,
        UPCAST=upcast, IEEE=ieee, INTERPRET=interpret, num_warps=4, num_stages=2)
    if splits > 1:
        _decode_merge[(n, h)](mid_o, mid_lse, out, h * splits, splits, 1, out.stride(0), out.stride(1),
                              D=dim, BLOCK_D=block_d, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
                              num_warps=4)
