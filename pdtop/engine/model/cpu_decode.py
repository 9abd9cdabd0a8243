"""The CPU decode fast path on a GGUF's blocks (`--dtype gguf`): a decode-only step's layers in one
C call (csrc/decode_step.c), nine kernels per layer, into buffers kept across steps.

At batch 1 a step's matmuls take a few milliseconds, and the generic layer forward (`llama.py`)
added a large share on top: nn.Module attribute look-ups, a new tensor per kernel call, views, the
checks of which kernel takes which tensor, ~270 ctypes calls. Here the layers' C functions and
fixed arguments (weights, shapes) are gathered once when the model is built, each thread keeps its
activation buffers (grown to the largest batch it ran), and a step passes only its own tensors'
pointers (rotations, slots, contexts, the cache). The kernels and their order are the generic
path's, so the results are the same bit for bit (`tests/engine/model/test_cpu_decode.py`).

`LlamaModel.forward_layers` asks `CpuDecode.run` first; it declines (None) whatever it does not
cover, and the generic path runs: prefill and chunked steps (prompt segments), several length
groups, a timer (`--trace`), biases or Qwen3's q/k norms, float layers, batches where
dequantize + oneDNN wins (`QuantLinear.dense_rows`).
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pdtop.engine.model import cpu_kernels
from pdtop.engine.model.quant_kernels import MatmulEntry
from pdtop.engine.model.quant_linear import QuantLinear

if TYPE_CHECKING:  # llama.py imports this module
    from pdtop.engine.model.llama import ForwardBatch, LlamaModel

MAX_ROWS = 256  # decode rows the fast path takes (its buffers grow to the largest batch seen)
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
MATMULS = ("qkv", "o", "gate_up", "down")


class _Matmul(ctypes.Structure):
    _fields_ = [("fn", _P), ("tails", _I), ("type", _I), ("w", _P), ("out_f", _I), ("in_f", _I), ("a", _I), ("b", _I)]


class _Layer(ctypes.Structure):
    _fields_ = [*((name, _Matmul) for name in MATMULS), ("attn_norm", _P), ("mlp_norm", _P),
                ("attn_eps", _F), ("mlp_eps", _F)]


class _Model(ctypes.Structure):
    _fields_ = [("norm", _P), ("rope_kv", _P), ("attend", _P), ("act", _P), ("dim", _I), ("h", _I), ("kvh", _I),
                ("d", _I), ("ffn", _I), ("scale", _F)]


BUFFERS = ("x", "qkv", "attn", "o", "gate_up", "act", "delta")


class _BufferPtrs(ctypes.Structure):
    _fields_ = [(name, _P) for name in BUFFERS]


@dataclass
class _Buffers:
    """One thread's activations for up to `rows` rows (`BUFFERS`: a norm's output, q|k|v, attention's
    output, o's, gate|up, SwiGLU's, the MLP's output) and the struct of their pointers."""
    rows: int
    tensors: dict[str, torch.Tensor]
    ptrs: _BufferPtrs


def _address(fn: Any) -> int | None:
    """Where a ctypes function's code is, for the C side to call."""
    return ctypes.cast(fn, _P).value


def _matmul(e: MatmulEntry) -> _Matmul:
    fn, (qtype, w, out_f, in_f), tail = e
    return _Matmul(_address(fn), len(tail), qtype, w, out_f, in_f, *tail, *([0] * (2 - len(tail))))


class CpuDecode:
    """The fast path for one model; `build` returns None where a layer does not fit it."""

    def __init__(self, model: LlamaModel, layers: list[_Layer], fns: list[Any], step: Any, max_rows: int):
        cfg = model.config
        self.ffn = layers[0].down.in_f  # the down projection's in_features
        self.widths = {"x": cfg.hidden, "qkv": (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim,
                       "attn": cfg.num_heads * cfg.head_dim, "o": cfg.hidden, "gate_up": 2 * self.ffn,
                       "act": self.ffn, "delta": cfg.hidden}
        self.model = _Model(*(_address(f) for f in fns), cfg.hidden, cfg.num_heads, cfg.num_kv_heads,
                            cfg.head_dim, self.ffn, cfg.head_dim ** -0.5)
        self.layers = (_Layer * len(layers))(*layers)
        self.step, self.max_rows = step, max_rows
        self.dim, self.kvh, self.d = cfg.hidden, cfg.num_kv_heads, cfg.head_dim
        self._local = threading.local()

    @classmethod
    def build(cls, model: LlamaModel) -> CpuDecode | None:
        cfg = model.config
        if (model.device.type != "cpu" or model.dtype != torch.float32 or cfg.qk_norm or cfg.hidden % 16
                or cfg.head_dim % 16 or cfg.head_dim > 128 or cfg.num_heads // cfg.num_kv_heads > 16):
            return None
        fns = [cpu_kernels.c_entry(k) for k in (cpu_kernels.add_rms_norm, cpu_kernels.rope_kv,
                                                 cpu_kernels.decode_attention, cpu_kernels.silu_mul)]
        lib = cpu_kernels._library("decode_step")
        if lib is None or any(f is None for f in fns):
            return None
        step = lib.pdtop_decode_layers
        step.restype = _I
        step.argtypes = [_P, _P, _I, _I, _P, _I, _P, _P, _P, _I, _I, _P, _P, _P, _I]
        layers, max_rows = [], MAX_ROWS
        for layer in model.decoder_layers:
            lins = (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down)
            quant = [m for m in lins if isinstance(m, QuantLinear) and m.bias is None]
            if len(quant) < 4 or quant[2].out_features % 32 or quant[2].out_features != 2 * quant[3].in_features:
                return None
            max_rows = min([max_rows, *(m.dense_rows - 1 for m in quant if m.dense_rows is not None)])
            an, mn = layer.attn_norm, layer.mlp_norm
            layers.append(_Layer(*(_matmul(m.entry) for m in quant), an.weight_f32.data_ptr(), mn.weight_f32.data_ptr(),
                                 an.eps, mn.eps))
        if max_rows < 1:
            return None
        return cls(model, layers, fns, step, max_rows)

    def _buffers(self, n: int) -> _Buffers:
        bufs: _Buffers | None = getattr(self._local, "bufs", None)
        if bufs is None or bufs.rows < n:
            rows = max(n, 2 * bufs.rows if bufs else 1)
            tensors = {name: torch.empty(rows, self.widths[name], dtype=torch.float32) for name in BUFFERS}
            bufs = _Buffers(rows, tensors, _BufferPtrs(*(t.data_ptr() for t in tensors.values())))
            self._local.bufs = bufs
        return bufs

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
        h = hidden.clone(memory_format=torch.contiguous_format)  # the residual stream, summed into in place
        failed = self.step(ctypes.byref(self.model), self.layers, start, end, h.data_ptr(), n, ctypes.byref(bufs.ptrs),
                           rot.data_ptr(), data.data_ptr(), data.stride(0), data.shape[3], slots.data_ptr(),
                           gather.data_ptr(), lens.data_ptr(), group.length)
        if failed:
            layer, which = divmod(failed - 1, 4)
            raise MemoryError(f"quantized matmul failed (layer {layer} {MATMULS[which]}, {n} rows)")
        return h.add_(bufs.tensors["delta"][:n])
