"""Tiny Llama-family checkpoints for tests: random HF-layout weights, written to GGUF the
way llama.cpp's converter writes them, and two independent references for their logits
(a plain float64 PyTorch forward pass here, and HF transformers where it is installed).

Converter conventions reproduced (convert_hf_to_gguf.py): `llama` files get Q/K rows
permuted for llama.cpp's adjacent-pair RoPE, `qwen2`/`qwen3` files keep HF's order;
Llama 3.x RoPE scaling becomes a `rope_freqs.weight` tensor of per-frequency divisors.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import quantize

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Tiny:
    arch: str = "llama"
    layers: int = 2
    hidden: int = 256   # K-quant blocks are 256 wide
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 512
    vocab: int = 320
    theta: float = 10000.0
    eps: float = 1e-5
    tied: bool = True
    bias: bool = False      # q/k/v biases (Qwen2)
    qk_norm: bool = False   # per-head q/k RMSNorm (Qwen3)
    llama3_rope: tuple[float, float, float, int] | None = None  # factor, low/high freq factors, original context
    extra_meta: dict = field(default_factory=dict)


TINY = {
    "llama": Tiny(),
    # short original context so that the scaling changes angles within a short prompt
    "llama3": Tiny(tied=False, llama3_rope=(8.0, 1.0, 4.0, 16)),
    "qwen2": Tiny(arch="qwen2", bias=True, theta=1e6, eps=1e-6),
    "qwen3": Tiny(arch="qwen3", qk_norm=True, head_dim=32, eps=1e-6),  # head_dim != hidden / heads
}


def hf_weights(t: Tiny, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under HF's names, in HF's layout (rotate-half Q/K)."""
    rng = np.random.default_rng(seed)

    def mat(*shape: int, std: float = 0.05) -> np.ndarray:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    nq, nk = t.heads * t.head_dim, t.kv_heads * t.head_dim
    w = {"model.embed_tokens.weight": mat(t.vocab, t.hidden, std=0.5), "model.norm.weight": norm(t.hidden)}
    w["lm_head.weight"] = w["model.embed_tokens.weight"] if t.tied else mat(t.vocab, t.hidden)
    for i in range(t.layers):
        p = f"model.layers.{i}."
        w.update({
            p + "input_layernorm.weight": norm(t.hidden), p + "post_attention_layernorm.weight": norm(t.hidden),
            p + "self_attn.q_proj.weight": mat(nq, t.hidden), p + "self_attn.k_proj.weight": mat(nk, t.hidden),
            p + "self_attn.v_proj.weight": mat(nk, t.hidden), p + "self_attn.o_proj.weight": mat(t.hidden, nq),
            p + "mlp.gate_proj.weight": mat(t.ffn, t.hidden), p + "mlp.up_proj.weight": mat(t.ffn, t.hidden),
            p + "mlp.down_proj.weight": mat(t.hidden, t.ffn),
        })
        if t.bias:
            w.update({p + "self_attn.q_proj.bias": mat(nq, std=0.5), p + "self_attn.k_proj.bias": mat(nk, std=0.5),
                      p + "self_attn.v_proj.bias": mat(nk, std=0.5)})
        if t.qk_norm:
            w.update({p + "self_attn.q_norm.weight": norm(t.head_dim), p + "self_attn.k_norm.weight": norm(t.head_dim)})
    return w


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `permute`: HF rotate-half rows -> adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_divisors(t: Tiny) -> np.ndarray:
    """What convert_hf_to_gguf.py stores as `rope_freqs.weight` for Llama 3.x scaling."""
    factor, low, high, original = t.llama3_rope
    out = []
    for f in 1.0 / t.theta ** (np.arange(0, t.head_dim, 2) / t.head_dim):
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gguf_tensors(t: Tiny, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF weights -> GGUF names and layout, as llama.cpp's converter maps them."""
    out = {"token_embd.weight": w["model.embed_tokens.weight"], "output_norm.weight": w["model.norm.weight"]}
    if not t.tied:
        out["output.weight"] = w["lm_head.weight"]
    if t.llama3_rope:
        out["rope_freqs.weight"] = llama3_rope_divisors(t)
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.bias": "attn_q.bias",
             "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
    for i in range(t.layers):
        for hf_name, g_name in names.items():
            arr = w.get(f"model.layers.{i}.{hf_name}")
            if arr is None:
                continue
            if t.arch == "llama" and g_name in ("attn_q.weight", "attn_k.weight"):
                arr = llama_cpp_permute(arr, t.heads if g_name == "attn_q.weight" else t.kv_heads)
            out[f"blk.{i}.{g_name}"] = arr
    return out


def write_gguf(path: Path, t: Tiny, tensors: dict[str, np.ndarray], types: dict[str, str] | None = None,
               raw: dict[str, tuple[np.ndarray, int]] | None = None) -> None:
    """A GGUF with `t`'s metadata and `tensors` (GGUF names), each stored as `types[suffix]`
    (a GGML type name, quantized with gguf.quants; default F32) or given as raw blocks in `raw`."""
    types, raw = types or {}, raw or {}
    w = gguf.GGUFWriter(str(path), t.arch)
    w.add_block_count(t.layers)
    w.add_context_length(512)
    w.add_embedding_length(t.hidden)
    w.add_feed_forward_length(t.ffn)
    w.add_head_count(t.heads)
    w.add_head_count_kv(t.kv_heads)
    if t.head_dim != t.hidden // t.heads:
        w.add_key_length(t.head_dim)
        w.add_value_length(t.head_dim)
    w.add_rope_freq_base(t.theta)
    w.add_layer_norm_rms_eps(t.eps)
    w.add_vocab_size(t.vocab)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    vtypes = {str: gguf.GGUFValueType.STRING, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    for key, value in t.extra_meta.items():
        w.add_key_value(key, value, vtypes[type(value)])
    for name, arr in tensors.items():
        if name in raw:
            blocks, qtype = raw[name]
            w.add_tensor(name, blocks, raw_dtype=qtype)
            continue
        kind = types.get(name.split(".")[-2], "F32") if arr.ndim == 2 else "F32"
        if kind == "F32":
            w.add_tensor(name, arr)
        elif kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, Q[kind]), raw_dtype=Q[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny(path: Path, t: Tiny, seed: int = 0, types: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Write a tiny model of kind `t`; return its HF weights."""
    w = hf_weights(t, seed)
    write_gguf(path, t, gguf_tensors(t, w), types)
    return w


def pdtop_logits(model, ids: list[int]) -> torch.Tensor:
    """pdtop's float32 logits at the last position of `ids` (one prefill through the runner)."""
    from pdtop.engine.request import Request
    from pdtop.engine.runtime.runner import ModelRunner

    r = ModelRunner(model, kv_capacity_tokens=256)
    req = Request(0, list(ids))
    r.admit(req)
    state = r.prefill_begin([req])
    r.prefill_layers(state, 0, model.num_layers)
    r.prefill_finish(state)
    return state.logits[0]


def reference_logits(t: Tiny, w: dict[str, np.ndarray], ids: list[int], scaled_rope: bool = True) -> torch.Tensor:
    """Last-position logits of `w` by the textbook Llama forward pass in float64: rotate-half
    RoPE on HF-layout weights, grouped-query attention, SwiGLU, optional biases and q/k norms."""
    W = {k: torch.from_numpy(v).double() for k, v in w.items()}
    n, d, H, KV = len(ids), t.head_dim, t.heads, t.kv_heads
    inv = 1.0 / t.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if t.llama3_rope and scaled_rope:
        inv = inv / torch.from_numpy(llama3_rope_divisors(t)).double()
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1)[:, None], torch.cat((ang.sin(), ang.sin()), -1)[:, None]

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + t.eps) * g

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1) * sin

    def proj(x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    x = W["model.embed_tokens.weight"][ids]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(t.layers):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = proj(h, p + "self_attn.q_proj").view(n, H, d)
        k = proj(h, p + "self_attn.k_proj").view(n, KV, d)
        v = proj(h, p + "self_attn.v_proj").view(n, KV, d)
        if t.qk_norm:
            q, k = rms(q, W[p + "self_attn.q_norm.weight"]), rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = rotate(q), rotate(k).repeat_interleave(H // KV, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", att, v.repeat_interleave(H // KV, 1)).reshape(n, H * d)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gate = h @ W[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    return (rms(x, W["model.norm.weight"]) @ W["lm_head.weight"].T)[-1]


def hf_logits(t: Tiny, w: dict[str, np.ndarray], ids: list[int]) -> torch.Tensor:
    """Last-position logits of HF transformers' own implementation of `t.arch` (skips without it)."""
    transformers = pytest.importorskip("transformers")
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[t.arch]
    config_cls = getattr(transformers, prefix + "Config")
    model_cls = getattr(transformers, prefix + "ForCausalLM")
    rope = {"rope_type": "default"}
    if t.llama3_rope:
        factor, low, high, original = t.llama3_rope
        rope = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": original}
    kw = {"vocab_size": t.vocab, "hidden_size": t.hidden, "intermediate_size": t.ffn, "num_hidden_layers": t.layers,
          "num_attention_heads": t.heads, "num_key_value_heads": t.kv_heads, "head_dim": t.head_dim,
          "rms_norm_eps": t.eps, "tie_word_embeddings": t.tied, "max_position_embeddings": 512}
    if "rope_parameters" in inspect.signature(config_cls.__init__).parameters:  # transformers >= 5
        kw["rope_parameters"] = {**rope, "rope_theta": t.theta}
    else:
        kw.update(rope_theta=t.theta, rope_scaling=rope if t.llama3_rope else None)
    model = model_cls(config_cls(**kw, attn_implementation="eager")).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()}, strict=True)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]
