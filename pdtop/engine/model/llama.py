"""PyTorch Llama (nano-vllm style) over packed tokens: embed / layers [start, end) / norm + logits.

All tokens of a forward pass are packed into one `[T, hidden]` tensor: first one
row per decoding sequence, then the prompt pieces being prefilled. `ForwardBatch`
(built by the runner) says where each token's K/V goes in the paged cache and what
each row attends to. q/k/v and gate/up are fused into one matmul each; on CPU the
weights are pre-packed for oneDNN (about twice as fast as `F.linear` for the
small-batch shapes of decode; see `linear.py`).

Precision in bfloat16 (what llama.cpp keeps in float32, and more than HF keeps): the weights,
the matmuls' inputs and outputs, attention and the KV cache are bfloat16; the residual stream
(embed -> every layer's sums -> the final norm), the RMSNorms (with float32 weights), RoPE,
the softmax inside attention and the leading logits are float32. A bfloat16 residual stream and
bfloat16 logits flipped near-tied greedy tokens ("What is the capital of France?" has its top two
0.08 apart): `docs/architecture.md` has the measurements.

`forward_layers(..., timer=)` tells a `PhaseTimer` when each layer's attention and MLP ran
(`ModelRunner.layer_trace`, `pdtop bench --trace`); without one the layers run untimed.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from pdtop.engine.errors import EngineError
from pdtop.engine.model import cpu_kernels, rope
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.model.cpu_decode import CpuDecode
from pdtop.engine.model.linear import Linear
from pdtop.engine.model.paged_attention import prefix_attention
from pdtop.engine.model.quant_linear import QuantLinear, QuantWeight, embedding, linear, weights_line

if TYPE_CHECKING:
    from pdtop.engine.model.paged_attention import PagedDecode
    from pdtop.engine.runtime.kv_cache import KVCache

# (phase "attn" | "mlp", layer, start, end): after each layer's attention and MLP, in `time.perf_counter`
# seconds, on the thread that ran them (on a GPU: the time their kernels took to launch, not to run)
PhaseTimer = Callable[[str, int, float, float], None]

REFINE_TOP = 64  # bfloat16: the leading logits of each row `LlamaModel.logits` re-takes in float32
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.bfloat16):
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise EngineError(f"unsupported dtype {dtype!r}; use float32 or bfloat16")


@dataclass
class Segment:
    """A run of prompt tokens of one sequence, packed after the decode rows."""
    offset: int               # first row in the packed batch
    length: int               # new tokens
    prefix: int               # tokens of this sequence already in the KV cache
    gather: torch.Tensor | None = None  # KV slots of prefix + new tokens (only when prefix > 0)
    mask: torch.Tensor | None = None    # [length, prefix + length] bool, True = attend; None: causal
                                        # to the last position (CUDA, `paged_attention.prefix_attention`)


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, attended together (padding stays within the group)."""
    rows: torch.Tensor | slice        # [G] long: which decode rows; slice(None) for a batch's only group
    gather: torch.Tensor              # [G * L] long: KV slots each row attends to
    length: int                       # L, the group's padded context length
    mask: torch.Tensor | None = None  # [G, 1, 1, L] bool, True = attend; None = all valid
    lens: torch.Tensor | None = None  # [G] long: each row's context length (for the CPU kernel)


@dataclass
class ForwardBatch:
    """What one forward pass needs besides the hidden states (built by `ModelRunner`)."""
    kv: KVCache
    positions: torch.Tensor           # [T] long
    slots: torch.Tensor               # [T] long: KV slot each token's K/V is written to
    num_decode: int = 0               # the first rows are single-token decode rows
    decode_groups: list[DecodeGroup] = field(default_factory=list)  # those rows, by context length
    segments: list[Segment] = field(default_factory=list)
    paged: PagedDecode | None = None  # CUDA: the decode rows read the paged cache in place instead
    _rope: torch.Tensor | None = None

    def rope(self, model: LlamaModel) -> torch.Tensor:
        """Rotations `[T, 1, head_dim/2]` (complex64), computed once per batch and shared by every layer."""
        if self._rope is None:
            freqs = self.positions.to(torch.float32)[:, None] * model.inv_freq[None, :]
            self._rope = torch.polar(torch.ones_like(freqs), freqs)[:, None, :]
        return self._rope


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (as HF and llama.cpp do), its output in `out_dtype` (default: the
    weight's): the model dtype where a matmul reads it, float32 for the final norm (`LlamaModel.logits`)."""

    def __init__(self, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None):
        super().__init__()
        self.out_dtype = out_dtype or weight.dtype
        self.weight_f32 = weight.float()
        self.eps = eps
        self.shape = (weight.shape[0],)

    def _kernel(self, *ts: torch.Tensor) -> cpu_kernels.AddRmsNorm | None:
        """The one-pass CPU kernel (csrc/rms_norm.c) when it takes these rows."""
        return cpu_kernels.add_rms_norm() if self.shape[0] % 16 == 0 and cpu_kernels.fits_rows(*ts) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernel := self._kernel(x):
            out = kernel(x, None, self.weight_f32, self.eps)[0]
        elif not x.is_cpu or (x.dtype != torch.float32 and x.shape[0] < 64):
            out = F.rms_norm(x.float(), self.shape, self.weight_f32, self.eps)  # one fused kernel on CUDA
        else:
            # Same arithmetic as F.rms_norm (float32 inside), which on CPU (torch 2.13) runs
            # nine kernels and is several times slower for thousands of rows.
            xf = x.float()
            out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(self.eps)) * self.weight_f32
        return out if out.dtype == self.out_dtype else out.to(self.out_dtype)

    def after_add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(x + delta, its norm)`, in one pass where the CPU kernel takes them. A float32 `x` (the
        residual stream) stays float32 whatever `delta`'s dtype: the sum is not rounded to bfloat16."""
        if kernel := self._kernel(x, delta):
            out, s = kernel(x, delta, self.weight_f32, self.eps)
            if s is not None:
                return s, out if out.dtype == self.out_dtype else out.to(self.out_dtype)
        s = x + delta
        return s, self.forward(s)


def rope_(x: torch.Tensor, rot: torch.Tensor) -> None:
    """RoPE in place on `[T, heads, head_dim]` (q and k together) whose rotary pairs are adjacent."""
    if x.dtype == torch.float32:
        torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(rot)
    else:  # no complex bfloat16: rotate in float32 and copy back
        x.copy_(torch.view_as_real(torch.view_as_complex(x.float().unflatten(-1, (-1, 2))) * rot).flatten(-2))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, qkv: Linear | QuantLinear, o: Linear | QuantLinear,
                 qk_norm: tuple[RMSNorm, RMSNorm] | None = None):
        super().__init__()
        self.layer = layer
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.nq, self.nk = self.h * self.d, self.kvh * self.d
        self.groups = self.h // self.kvh
        self.scale = self.d ** -0.5
        self.qkv, self.o = qkv, o
        self.qk_norm = qk_norm  # (q norm, k norm): Qwen3's per-head RMSNorm before RoPE

    def forward(self, x: torch.Tensor, batch: ForwardBatch, rot: torch.Tensor) -> torch.Tensor:
        t, h, kvh, d, nq, nk = x.shape[0], self.h, self.kvh, self.d, self.nq, self.nk
        qkv = self.qkv.forward(x)  # [t, q | k | v]; q and k are rotated in place
        qk = qkv[:, : nq + nk].view(t, h + kvh, d)
        if self.qk_norm is not None:
            q_norm, k_norm = self.qk_norm
            qk[:, :h] = q_norm.forward(qk[:, :h])
            qk[:, h:] = k_norm.forward(qk[:, h:])
        q = qk[:, :h]
        kv = qkv[:, nq:].view(t, 2, kvh, d)
        cache = batch.kv.layer(self.layer)  # [2, kv_heads, slots, head_dim]
        if cpu_kernels.fits_rope_kv(qkv, rot, cache, batch.slots) and (rope_kv := cpu_kernels.rope_kv()):
            rope_kv(qkv, rot, cache, batch.slots, h, kvh)  # one pass (csrc/rope_kv.c)
        else:
            rope_(qk, rot)
            cache.index_copy_(2, batch.slots, kv.permute(1, 2, 0, 3))
        nd, segs = batch.num_decode, batch.segments
        if not segs:
            out = self._decode(q, cache, batch)
        elif not nd and len(segs) == 1:
            out = self._prefill(q, kv, cache, segs[0])
        else:
            out = torch.empty(t, h, d, dtype=x.dtype, device=x.device)
            if nd:
                out[:nd] = self._decode(q[:nd], cache, batch)
            for seg in segs:
                rows = slice(seg.offset, seg.offset + seg.length)
                out[rows] = self._prefill(q[rows], kv[rows], cache, seg)
        return self.o.forward(out.reshape(t, h * d))

    def _decode(self, q: torch.Tensor, cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """One query per row against its gathered context, by length group when lengths differ widely."""
        if batch.paged is not None:
            return batch.paged.attend(q, cache, self.scale)
        groups = batch.decode_groups
        if len(groups) == 1:  # the usual case: every row in one group
            return self._attend(q, cache, groups[0])
        out = torch.empty_like(q)
        for g in groups:
            out[g.rows] = self._attend(q[g.rows], cache, g)
        return out

    def _attend(self, q: torch.Tensor, cache: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
        n, kvh, d, L, mask = q.shape[0], self.kvh, self.d, group.length, group.mask
        if group.lens is not None and cpu_kernels.supports(q, cache):
            kernel = cpu_kernels.decode_attention()
            if kernel is not None:  # reads K/V in place (csrc/decode_attention.c)
                return kernel(q, cache, group.gather.view(n, L), group.lens, self.scale)
        ctx = gather(cache, group.gather).view(2, kvh, n, L, d)
        kk, vv = ctx[0].transpose(0, 1), ctx[1].transpose(0, 1)
        if _HAS_GQA and L <= 256 and q.dtype == torch.float32 and q.is_cpu and torch.get_num_threads() > 1:
            # torch 2.13's CPU flash kernel splits this shape (one query row per head) well over
            # threads, the grouped one below hardly at all: 1.2-1.9x faster for short contexts
            # at 2 threads. Longer contexts re-read K/V per query head and lose.
            o = F.scaled_dot_product_attention(q[:, :, None], kk, vv, attn_mask=mask,
                                               scale=self.scale, enable_gqa=True)
        else:  # GQA by grouping each K/V head's query heads as rows
            o = F.scaled_dot_product_attention(q.reshape(n, kvh, self.groups, d), kk, vv,
                                               attn_mask=mask, scale=self.scale)
        return o.reshape(n, self.h, d)

    def _prefill(self, q: torch.Tensor, kv: torch.Tensor, cache: torch.Tensor, seg: Segment) -> torch.Tensor:
        qt = q.transpose(0, 1)[None]
        if seg.gather is not None and seg.mask is None:  # CUDA: no mask, so SDPA's fused kernels apply
            ctx = gather(cache, seg.gather)
            o = prefix_attention(qt, ctx[0][None], ctx[1][None], self.groups, self.scale)
        elif seg.gather is not None:  # attend to the cached prefix too (the new tokens were just written)
            ctx = gather(cache, seg.gather)
            o = sdpa_gqa(qt, ctx[0][None], ctx[1][None], self.groups, attn_mask=seg.mask, scale=self.scale)
        else:
            kt, vt = kv[:, 0].transpose(0, 1)[None], kv[:, 1].transpose(0, 1)[None]
            o = sdpa_gqa(qt, kt, vt, self.groups, is_causal=True, scale=self.scale)
        return o[0].transpose(0, 1)


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`[2, kv_heads, len(slots), head_dim]`: K and V at `slots` of one layer's cache."""
    two, kvh, n, d = cache.shape
    # index_select along dim 1 of a 3-D tensor has a fast path (about 1.4x faster here)
    return cache.view(two * kvh, n, d).index_select(1, slots).view(two, kvh, -1, d)


_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, **kw: Any) -> torch.Tensor:
    """SDPA where each k/v head serves `groups` query heads (no copies where torch supports it)."""
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    if _HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), **kw)


class MLP(nn.Module):
    def __init__(self, gate_up: Linear | QuantLinear, down: Linear | QuantLinear):
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up.forward(x)
        if gate_up.shape[1] % 32 == 0 and cpu_kernels.fits_rows(gate_up) and (act := cpu_kernels.silu_mul()):
            return self.down.forward(act(gate_up))  # one pass, no parallel region at decode sizes
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down.forward(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, attn: Attention, mlp: MLP, attn_norm: RMSNorm, mlp_norm: RMSNorm):
        super().__init__()
        self.attn, self.mlp = attn, mlp
        self.attn_norm, self.mlp_norm = attn_norm, mlp_norm

    def forward(self, h: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch,
                rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(h, delta)`: the residual stream and the MLP output not yet added to it, which the next
        layer adds in the same pass as its norm (`forward_layers` adds the last one)."""
        # .forward directly: nn.Module.__call__ costs a few microseconds per call, ~0.5 ms per step
        h, x = self.attn_norm.after_add(h, delta) if delta is not None else (h, self.attn_norm.forward(h))
        h, x = self.mlp_norm.after_add(h, self.attn.forward(x, batch, rot))
        return h, self.mlp.forward(x)

    def forward_timed(self, h: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch, rot: torch.Tensor,
                      timer: PhaseTimer) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, telling `timer` when the attention and the MLP ran."""
        h, x = self.attn_norm.after_add(h, delta) if delta is not None else (h, self.attn_norm.forward(h))
        t0 = time.perf_counter()
        attn = self.attn.forward(x, batch, rot)
        timer("attn", self.attn.layer, t0, time.perf_counter())
        h, x = self.mlp_norm.after_add(h, attn)
        t0 = time.perf_counter()
        out = self.mlp.forward(x)
        timer("mlp", self.attn.layer, t0, time.perf_counter())
        return h, out


class LlamaModel(nn.Module):
    """A Llama-family decoder (Llama, Qwen2, Qwen3). Build it with `synthetic_model` or
    `loader.load_model`.

    `weights` are fused (`{i}.qkv`, `{i}.gate_up`, ...), with the rows of Q and K (and of
    their biases and norms) in adjacent-pair RoPE order, as llama.cpp stores Llama GGUFs
    (the loader converts other layouts once; see `rope.py`). Optional: `{i}.qkv_bias`,
    `{i}.o_bias`, `{i}.q_norm`/`{i}.k_norm` (with `cfg.qk_norm`), `rope_freqs` (per-frequency
    divisors). The constructor takes the tensors over (the dict is emptied of what it packs).
    """

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.config, self.dtype, self.device = cfg, dtype, device
        w = weights
        self.embed_weight = w["embed"]
        layers = []
        for i in range(cfg.num_layers):
            p = f"{i}."
            qk_norm = None
            if cfg.qk_norm:
                qk_norm = (RMSNorm(w.pop(p + "q_norm"), cfg.rms_eps, dtype),
                           RMSNorm(w.pop(p + "k_norm"), cfg.rms_eps, dtype))
            attn = Attention(cfg, i, linear(w.pop(p + "qkv"), bias=w.pop(p + "qkv_bias", None)),
                             linear(w.pop(p + "o"), bias=w.pop(p + "o_bias", None)), qk_norm)
            mlp = MLP(linear(w.pop(p + "gate_up")), linear(w.pop(p + "down")))
            layers.append(DecoderLayer(attn, mlp, RMSNorm(w.pop(p + "attn_norm"), cfg.rms_eps, dtype),
                                       RMSNorm(w.pop(p + "mlp_norm"), cfg.rms_eps, dtype)))
        self.layers = nn.ModuleList(layers)
        self.decoder_layers: list[DecoderLayer] = layers  # the same layers, typed (a ModuleList holds Modules)
        self.norm = RMSNorm(w.pop("norm"), cfg.rms_eps, torch.float32)  # float32 out: `logits` refines with it
        lm_head = w["embed"] if cfg.tie_embeddings else w.pop("lm_head")
        self.lm_head = linear(lm_head)
        # the plain rows `logits` re-takes in float32 (the Linear may hold a oneDNN-packed copy instead)
        self.lm_head_rows = lm_head if dtype != torch.float32 else None
        kept = [m.weight for m in self.modules() if isinstance(m, QuantLinear)]
        if isinstance(self.embed_weight, QuantWeight):
            kept.append(self.embed_weight)
        # "float32", or "gguf Q4_1+Q8_0 (avx2)" when matmuls run on the file's blocks (--dtype gguf)
        self.weights = weights_line(kept) if kept else str(dtype).removeprefix("torch.")
        self.inv_freq = rope.inv_freq(cfg, w.pop("rope_freqs", None), device=device)
        # decode steps on the file's blocks as plain C calls (cpu_decode.py); None: the layers' forward
        self.cpu_decode = CpuDecode.build(self) if kept else None

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def dtype_bytes(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The residual stream's first values: float32 whatever the model dtype (see `logits`)."""
        h = embedding(ids, self.embed_weight)
        return h if h.dtype == torch.float32 else h.float()

    def forward_layers(self, hidden: torch.Tensor, batch: ForwardBatch, start: int, end: int,
                       timer: PhaseTimer | None = None) -> torch.Tensor:
        """Run layers [start, end) on the packed hidden states, writing their K/V into the cache; with a
        `timer`, tell it when each layer's attention and MLP ran."""
        rot = batch.rope(self)
        if timer is None and self.cpu_decode is not None:
            out = self.cpu_decode.run(hidden, batch, start, end, rot)
            if out is not None:
                return out
        delta = None
        if timer is None:
            for layer in self.layers[start:end]:
                hidden, delta = layer.forward(hidden, delta, batch, rot)
        else:
            for layer in self.decoder_layers[start:end]:
                hidden, delta = layer.forward_timed(hidden, delta, batch, rot, timer)
        return hidden if delta is None else hidden + delta

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on the rows that need a next token; float32 `[n, vocab]`.

        In bfloat16 the LM head's outputs are rounded to 8 bits (steps of 1/8 for logits of 16-32,
        while the top two of a greedy step are often closer than that), so the `REFINE_TOP` leading
        logits of each row are taken again in float32 from the same bfloat16 weights: greedy and
        top-k/top-p choices see float32 logits, the tail keeps bfloat16's."""
        x = self.norm.forward(hidden_last)
        if self.lm_head_rows is None:
            return self.lm_head.forward(x)
        out = self.lm_head.forward(x.to(self.dtype)).float()
        top = out.topk(min(REFINE_TOP, out.shape[1]), dim=1).indices  # [n, k]
        rows = self.lm_head_rows.index_select(0, top.flatten()).view(*top.shape, -1).float()  # [n, k, hidden]
        return out.scatter_(1, top, torch.bmm(rows, x.unsqueeze(2)).squeeze(2))
