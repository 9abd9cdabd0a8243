"""The CPU decode fast path on a GGUF's blocks (`--dtype gguf`): a decode-only step's layers as plain
C calls, nine per layer, into buffers kept across steps.

At batch 1 a step's matmuls take a few milliseconds, and the generic layer forward (`llama.py`) used
to add a large share on top: nn.Module attribute look-ups, a new tensor per kernel call, views,
the checks of which kernel takes which tensor. Here all of that is done once when the model is
built: each layer's C functions with their fixed arguments (weights, shapes), and per thread and
batch size the argument tuples over reused buffers. A step only reads its own tensors' pointers
(rotations, slots, contexts, the cache). The kernels and their order are the generic path's, so
the results are bit for bit the same (`tests/engine/model/test_cpu_decode.py`).

`LlamaModel.forward_layers` asks `CpuDecode.run` first; it declines (None) whatever it does not
cover, and the generic path runs: prefill and chunked steps (prompt segments), several length
groups, a timer (`--trace`), biases or Qwen3's q/k norms, float layers, batches where
dequantize + oneDNN wins (`QuantLinear.dense_rows`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pdtop.engine.model import cpu_kernels
from pdtop.engine.model.quant_kernels import MatmulEntry
from pdtop.engine.model.quant_linear import QuantLinear

if TYPE_CHECKING:
    from pdtop.engine.model.llama import ForwardBatch, LlamaModel

MAX_ROWS = 256  # decode rows the fast path takes (its buffers grow to the largest batch seen)


@dataclass(frozen=True)
class _Layer:
    """One layer's fixed arguments: its four matmuls and its two norms' (weight pointer, eps)."""
    qkv: MatmulEntry
    o: MatmulEntry
    gate_up: MatmulEntry
    down: MatmulEntry
    attn_norm: tuple[int, float]
    mlp_norm: tuple[int, float]


@dataclass
class _Buffers:
    """One thread's activations for up to `rows` rows, and its argument tuples by batch size."""
    rows: int
    x: torch.Tensor       # [rows, dim]: a norm's output, a matmul's input
    qkv: torch.Tensor     # [rows, q | k | v]
    attn: torch.Tensor    # [rows, heads * head_dim]
    o: torch.Tensor       # [rows, dim]
    gate_up: torch.Tensor  # [rows, 2 ffn]
    act: torch.Tensor     # [rows, ffn]
    delta: torch.Tensor   # [rows, dim]: the MLP's output, added by the next layer's norm
    calls: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)


class CpuDecode:
    """The fast path for one model; `build` returns None where a layer does not fit it."""

    def __init__(self, model: LlamaModel, layers: list[_Layer], fns: tuple[Any, Any, Any, Any], max_rows: int):
        cfg = model.config
        self.layers, self.fns, self.max_rows = layers, fns, max_rows
        self.dim, self.h, self.kvh, self.d = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_width = (self.h + 2 * self.kvh) * self.d
        self.ffn = layers[0].down[1][3]  # the down projection's in_features
        self.scale = self.d ** -0.5
        self._local = threading.local()

    @classmethod
    def build(cls, model: LlamaModel) -> CpuDecode | None:
        cfg = model.config
        if (model.device.type != "cpu" or model.dtype != torch.float32 or cfg.qk_norm or cfg.hidden % 16
                or cfg.head_dim % 16 or cfg.head_dim > 128 or cfg.num_heads // cfg.num_kv_heads > 16):
            return None
        fns = tuple(cpu_kernels.c_entry(k) for k in (cpu_kernels.add_rms_norm, cpu_kernels.rope_kv,
                                                       cpu_kernels.decode_attention, cpu_kernels.silu_mul))
        if any(f is None for f in fns):
            return None
        layers, max_rows = [], MAX_ROWS
        for layer in model.decoder_layers:
            lins = (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down)
            if not all(isinstance(m, QuantLinear) and m.bias is None for m in lins):
                return None
            qkv, o, gate_up, down = lins
            assert isinstance(qkv, QuantLinear) and isinstance(o, QuantLinear)
            assert isinstance(gate_up, QuantLinear) and isinstance(down, QuantLinear)
            if gate_up.out_features % 32 or gate_up.out_features != 2 * down.in_features:
                return None
            for m in (qkv, o, gate_up, down):
                if m.dense_rows is not None:
                    max_rows = min(max_rows, m.dense_rows - 1)
            an, mn = layer.attn_norm, layer.mlp_norm
            layers.append(_Layer(qkv.entry, o.entry, gate_up.entry, down.entry,
                                 (an.weight_f32.data_ptr(), an.eps), (mn.weight_f32.data_ptr(), mn.eps)))
        if max_rows < 1:
            return None
        return cls(model, layers, (fns[0], fns[1], fns[2], fns[3]), max_rows)

    def _buffers(self, n: int) -> _Buffers:
        bufs: _Buffers | None = getattr(self._local, "bufs", None)
        if bufs is None or bufs.rows < n:
            rows = max(n, 2 * bufs.rows if bufs else 1)

            def empty(width: int) -> torch.Tensor:
                return torch.empty(rows, width, dtype=torch.float32)

            bufs = _Buffers(rows, empty(self.dim), empty(self.qkv_width), empty(self.h * self.d), empty(self.dim),
                            empty(2 * self.ffn), empty(self.ffn), empty(self.dim))
            self._local.bufs = bufs
        return bufs

    def _calls(self, bufs: _Buffers, n: int) -> list[tuple[Any, ...]]:
        """Per layer: its matmuls' full argument tuples over `bufs` for `n` rows, and its norms' tails."""
        calls = bufs.calls.get(n)
        if calls is None:
            x, qkv, attn, o = bufs.x.data_ptr(), bufs.qkv.data_ptr(), bufs.attn.data_ptr(), bufs.o.data_ptr()
            gu, act, delta = bufs.gate_up.data_ptr(), bufs.act.data_ptr(), bufs.delta.data_ptr()

            def mm(e: MatmulEntry, src: int, dst: int) -> tuple[Any, ...]:
                return (e[0], (*e[1], src, n, dst, *e[2]))

            calls = [(mm(lay.qkv, x, qkv), mm(lay.o, attn, o), mm(lay.gate_up, x, gu), mm(lay.down, act, delta),
                      (*lay.attn_norm[:1], x, n, self.dim, lay.attn_norm[1]),
                      (*lay.mlp_norm[:1], x, n, self.dim, lay.mlp_norm[1])) for lay in self.layers]
            bufs.calls[n] = calls
        return calls

    def run(self, hidden: torch.Tensor, batch: ForwardBatch, start: int, end: int,
            rot: torch.Tensor) -> torch.Tensor | None:
        """Layers [start, end) of a decode-only batch, as `LlamaModel.forward_layers` computes them; None
        (nothing run) where this batch is not one the fast path takes."""
        n = hidden.shape[0]
        if (batch.segments or batch.paged is not None or len(batch.decode_groups) != 1 or not 0 < n <= self.max_rows
                or not start < end or hidden.dtype != torch.float32 or hidden.dim() != 2 or hidden.shape[1] != self.dim
                or not hidden.is_cpu):
            return None
        group, data, slots = batch.decode_groups[0], batch.kv.data, batch.slots
        gather, lens = group.gather, group.lens
        if (lens is None or lens.dtype != torch.int64 or gather.dtype != torch.int64 or slots.dtype != torch.int64
                or data.dtype != torch.float32 or not data.is_contiguous() or data.shape[2] != self.kvh
                or data.shape[4] != self.d or rot.dtype != torch.complex64 or rot.shape[0] != n
                or 2 * rot.shape[-1] != self.d or gather.numel() != n * group.length
                or not (lens.is_contiguous() and gather.is_contiguous() and slots.is_contiguous()
                        and rot.is_contiguous())):
            return None
        bufs = self._buffers(n)
        calls = self._calls(bufs, n)
        norm, rope_kv, attend, act = self.fns
        h = hidden.clone(memory_format=torch.contiguous_format)  # the residual stream, summed into in place
        hp, qkv, attn, gu, acts = h.data_ptr(), bufs.qkv.data_ptr(), bufs.attn.data_ptr(), \
            bufs.gate_up.data_ptr(), bufs.act.data_ptr()
        op, dp = bufs.o.data_ptr(), bufs.delta.data_ptr()
        rp, sp, gp, lp, length = rot.data_ptr(), slots.data_ptr(), gather.data_ptr(), lens.data_ptr(), group.length
        S, layer_bytes, base = data.shape[3], data.stride(0) * 4, data.data_ptr()
        h_, kvh, d, width, ffn, scale = self.h, self.kvh, self.d, self.qkv_width, self.ffn, self.scale
        for i in range(start, end):
            (f_qkv, a_qkv), (f_o, a_o), (f_gu, a_gu), (f_down, a_down), attn_norm, mlp_norm = calls[i]
            cache = base + i * layer_bytes
            if i == start:
                norm(hp, None, None, *attn_norm)
            else:
                norm(hp, dp, hp, *attn_norm)  # h += the last MLP's output, in place, and its norm
            if f_qkv(*a_qkv):
                raise MemoryError(f"quantized matmul failed (layer {i} qkv, {n} rows)")
            rope_kv(qkv, width, rp, cache, sp, n, h_, kvh, d, S)
            attend(qkv, width, cache, gp, lp, attn, n, h_, kvh, d, S, length, scale)
            if f_o(*a_o):
                raise MemoryError(f"quantized matmul failed (layer {i} o, {n} rows)")
            norm(hp, op, hp, *mlp_norm)
            if f_gu(*a_gu):
                raise MemoryError(f"quantized matmul failed (layer {i} gate_up, {n} rows)")
            act(gu, 2 * ffn, acts, n, ffn)
            if f_down(*a_down):
                raise MemoryError(f"quantized matmul failed (layer {i} down, {n} rows)")
        return h.add_(bufs.delta[:n])
