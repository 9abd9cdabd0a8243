"""Roofline cost of decode and prefill work (the seed's estimate terms), as pure functions.

Decode is memory-bound: a step reads the weights once plus every request's KV, and its
bandwidth shrinks as `min(1, sms / s_sat)` on fewer SMs. Prefill is compute-bound: 2 FLOPs
per linear parameter per token plus causal attention, at `mfu` of peak, proportional to
its SMs. FLOP counts are exact integers (returned as floats) so per-layer shares add up
exactly to the whole.
"""
from __future__ import annotations

from collections.abc import Sequence

from pdtop.engine.model.config import ModelConfig
from pdtop.engine.roofline.gpu_specs import GpuSpec


def _attn_flops_per_layer(cfg: ModelConfig, tokens: int, start: int) -> int:
    """QK^T and PV for `tokens` queries after `start` cached ones: 2*2*qdim*(tokens*start + tokens^2/2)."""
    qdim = cfg.num_heads * cfg.head_dim
    return 2 * qdim * (2 * tokens * start + tokens * tokens)


def decode_bytes(cfg: ModelConfig, context_lens: Sequence[int], dtype_bytes: int = 2) -> float:
    """Bytes one decode step reads: every weight once plus each request's KV cache."""
    return float(dtype_bytes * cfg.linear_params + sum(context_lens) * cfg.kv_bytes_per_token(dtype_bytes))


def decode_flops(cfg: ModelConfig, context_lens: Sequence[int]) -> float:
    """FLOPs of one decode step: one token per request through the linears, attention over its context."""
    linear = 2 * cfg.linear_params * len(context_lens)
    attn = sum(cfg.num_layers * 2 * 2 * cfg.num_heads * cfg.head_dim * n for n in context_lens)
    return float(linear + attn)


def prefill_layer_flops(cfg: ModelConfig, tokens: int, start: int, layers: int) -> float:
    """FLOPs of `layers` decoder layers for tokens `[start, start + tokens)` (no LM head)."""
    per_layer = 2 * cfg.linear_params_per_layer * tokens + _attn_flops_per_layer(cfg, tokens, start)
    return float(layers * per_layer)


def prefill_head_flops(cfg: ModelConfig, tokens: int) -> float:
    """FLOPs of the LM head over `tokens` tokens (counted for all of them, as the seed does)."""
    return float(2 * cfg.hidden * cfg.vocab * tokens)


def prefill_flops(cfg: ModelConfig, tokens: int, start: int = 0) -> float:
    """The seed's prefill FLOPs: 2 * LINEAR * tokens + causal attention; = all layers + head."""
    return float(cfg.num_layers * (2 * cfg.linear_params_per_layer * tokens + _attn_flops_per_layer(cfg, tokens, start))
                 + 2 * cfg.hidden * cfg.vocab * tokens)


def prefill_bytes(cfg: ModelConfig, tokens: int, layers: int, dtype_bytes: int = 2, head: bool = False) -> float:
    """Bytes a prefill of `layers` layers moves: their weights plus the KV it writes (plus the LM head's
    weights if `head`)."""
    weights = layers * cfg.linear_params_per_layer + (cfg.hidden * cfg.vocab if head else 0)
    kv = tokens * layers * 2 * cfg.num_kv_heads * cfg.head_dim
    return float(dtype_bytes * (weights + kv))


def achieved_bandwidth(spec: GpuSpec) -> float:
    """Bytes/s the whole GPU streams: peak * bw_eff."""
    return spec.mem_bw * spec.bw_eff


def decode_time(spec: GpuSpec, nbytes: float, sms: int) -> float:
    """Seconds to stream `nbytes` on `sms` SMs: bandwidth * bw_eff, scaled by min(1, sms / s_sat)."""
    if sms <= 0:
        raise ValueError(f"decode needs at least one SM, got {sms}")
    return nbytes / (achieved_bandwidth(spec) * min(1.0, sms / spec.s_sat))


def memory_time(spec: GpuSpec, nbytes: float) -> float:
    """Seconds to stream `nbytes` at the achieved bandwidth of the whole GPU (peak * bw_eff)."""
    return nbytes / achieved_bandwidth(spec)


def prefill_time(spec: GpuSpec, flops: float, sms: int) -> float:
    """Seconds for `flops` on `sms` SMs: peak * mfu, proportional to the share of SMs."""
    if sms <= 0:
        raise ValueError(f"prefill needs at least one SM, got {sms}")
    return flops / (spec.peak_flops * spec.mfu * sms / spec.sms)


def chunk_step_time(spec: GpuSpec, cfg: ModelConfig, chunk: int, start: int, decode_bs: int, base: float) -> float:
    """One chunked-prefill step on the whole GPU: a `chunk` of prefill from `start` plus the
    decode batch's linear FLOPs, compute-bound, but never faster than a plain decode step `base`."""
    flops = prefill_flops(cfg, chunk, start) + 2 * cfg.linear_params * decode_bs
    return max(flops / (spec.peak_flops * spec.mfu), base)
