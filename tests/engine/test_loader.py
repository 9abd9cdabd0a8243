"""GGUF loading: metadata, every supported tensor type, llama.cpp's Q/K permutation, bad files."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize

from pdtop.engine.errors import EngineError, ModelFileError, UnsupportedModelError
from pdtop.engine.model.loader import default_model_path, load_gguf, load_model, read_config
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.scheduler import generate

Q = gguf.GGMLQuantizationType
TINY = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=320)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `permute` (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def q6_k_constant(rows: int, cols: int, d: float, scale: int, q: int) -> np.ndarray:
    """Q6_K blocks whose every weight is d * scale * (q - 32): ql low/high nibbles and qh pairs all hold q."""
    block = np.zeros(210, dtype=np.uint8)
    lo, hi = q & 0xF, q >> 4
    block[:128] = lo | (lo << 4)
    block[128:192] = hi | (hi << 2) | (hi << 4) | (hi << 6)
    block[192:208] = np.array([scale] * 16, dtype=np.int8).view(np.uint8)
    block[208:210] = np.array([d], dtype=np.float16).view(np.uint8)
    return np.tile(block, (rows, cols // 256))


def write_tiny_llama(path: Path, arch: str = "llama", types: dict[str, str] | None = None,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """A small random Llama GGUF written the way llama.cpp writes one (Q/K permuted).

    `types` maps a tensor name suffix (e.g. "ffn_up") to a GGML type name; default F32.
    Returns the original (unpermuted, unquantized) float32 weights by GGUF name.
    """
    types = types or {}
    c = TINY
    rng = np.random.default_rng(seed)
    head_dim = c["hidden"] // c["heads"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["layers"])
    w.add_context_length(512)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(c["vocab"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    shapes = {"token_embd.weight": (c["vocab"], c["hidden"]), "output_norm.weight": (c["hidden"],)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm.weight": (c["hidden"],), p + "ffn_norm.weight": (c["hidden"],),
            p + "attn_q.weight": (c["heads"] * head_dim, c["hidden"]),
            p + "attn_k.weight": (c["kv_heads"] * head_dim, c["hidden"]),
            p + "attn_v.weight": (c["kv_heads"] * head_dim, c["hidden"]),
            p + "attn_output.weight": (c["hidden"], c["heads"] * head_dim),
            p + "ffn_gate.weight": (c["ffn"], c["hidden"]), p + "ffn_up.weight": (c["ffn"], c["hidden"]),
            p + "ffn_down.weight": (c["hidden"], c["ffn"]),
        })
    originals = {}
    for name, shape in shapes.items():
        arr = (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
               else 0.05 * rng.standard_normal(shape)).astype(np.float32)
        originals[name] = arr
        stored = arr
        if name.endswith("attn_q.weight"):
            stored = llama_cpp_permute(arr, c["heads"])
        elif name.endswith("attn_k.weight"):
            stored = llama_cpp_permute(arr, c["kv_heads"])
        kind = types.get(name.split(".")[-2], "F32")
        if kind == "F32":
            w.add_tensor(name, stored)
        elif kind == "F16":
            w.add_tensor(name, stored.astype(np.float16))
        elif kind == "Q6_K":
            w.add_tensor(name, q6_k_constant(*shape, d=0.5, scale=3, q=33), raw_dtype=Q.Q6_K)
            originals[name] = np.full(shape, 1.5, dtype=np.float32)
        elif kind == "Q5_K":
            w.add_tensor(name, np.zeros((shape[0], shape[1] // 256 * 176), dtype=np.uint8), raw_dtype=Q.Q5_K)
        else:
            w.add_tensor(name, quantize(stored, Q[kind]), raw_dtype=Q[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return originals


def test_default_model_config(gguf_path):
    assert gguf_path == default_model_path() and gguf_path.suffix == ".gguf"
    cfg = read_config(gguf_path)
    reader = gguf.GGUFReader(gguf_path)
    meta = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("llama.")}
    assert (cfg.num_layers, cfg.hidden, cfg.ffn) == (meta["llama.block_count"], meta["llama.embedding_length"],
                                                     meta["llama.feed_forward_length"])
    assert (cfg.num_heads, cfg.num_kv_heads) == (meta["llama.attention.head_count"],
                                                 meta["llama.attention.head_count_kv"])
    assert cfg.head_dim * cfg.num_heads == cfg.hidden
    assert cfg.max_context == meta["llama.context_length"]
    assert cfg.rope_theta == meta["llama.rope.freq_base"]
    assert cfg.eos_ids == (reader.fields["tokenizer.ggml.eos_token_id"].contents(),)
    assert cfg.bos_id == reader.fields["tokenizer.ggml.bos_token_id"].contents()
    assert cfg.tie_embeddings and not any(t.name == "output.weight" for t in reader.tensors)


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_tensor_types_dequantize_and_qk_permutation_is_undone(tmp_path, kind):
    path = tmp_path / f"tiny-{kind}.gguf"
    types = {n: kind for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    originals = write_tiny_llama(path, types=types)
    loaded = load_gguf(path)
    assert loaded.config.num_layers == TINY["layers"] and loaded.config.tie_embeddings
    # quantization error bound per type (the weights have std 0.05, |w| < 0.3)
    tol = {"F32": 0, "F16": 2e-4, "BF16": 2e-3, "Q8_0": 3e-3, "Q4_0": 0.05, "Q4_1": 0.03}[kind]
    for name, orig in originals.items():
        err = np.abs(loaded.tensors[name] - orig).max()
        assert err <= tol, f"{name}: max error {err} > {tol}"


def test_q6_k_and_tiny_model_runs(tmp_path):
    path = tmp_path / "tiny-q6k.gguf"
    write_tiny_llama(path, types={"ffn_down": "Q6_K"})
    loaded = load_gguf(path)
    assert np.all(loaded.tensors["blk.0.ffn_down.weight"] == 1.5)
    model = load_model(path)
    runner = ModelRunner(model, kv_capacity_tokens=64)
    seq = Request(0, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    assert list(generate(runner, seq)) == seq.output_ids
    assert len(seq.output_ids) == 4 and all(0 <= t < TINY["vocab"] for t in seq.output_ids)


def test_unsupported_tensor_type(tmp_path):
    path = tmp_path / "q5k.gguf"
    write_tiny_llama(path, types={"ffn_up": "Q5_K"})
    with pytest.raises(UnsupportedModelError, match=r"q5k\.gguf: tensor blk\.0\.ffn_up\.weight has unsupported type Q5_K"):
        load_gguf(path)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError) as exc:
        load_model(path)
    msg = str(exc.value)
    assert str(path) in msg and "'mamba'" in msg and "\n" not in msg


@pytest.mark.parametrize("keep", [100, 2_000_000, -4096])
def test_truncated_gguf(tmp_path, gguf_path, keep):
    """Cut inside the header, inside the metadata (tokenizer arrays), and inside the last tensor."""
    data = gguf_path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    with pytest.raises(ModelFileError) as exc:
        load_model(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: truncated") and "\n" not in msg


@pytest.mark.parametrize("content", [b"", b"hello world, not a model\n", b"GGU"])
def test_not_a_gguf(tmp_path, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=r"notes\.txt: not a GGUF file"):
        load_model(path)


def test_missing_file_and_bad_names(tmp_path):
    with pytest.raises(ModelFileError, match="model file not found"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="not a file"):
        load_model(tmp_path)
    with pytest.raises(UnsupportedModelError, match="unknown synthetic model"):
        load_model("synthetic:gpt-5")
    with pytest.raises(EngineError, match="unsupported dtype"):
        load_model("synthetic:smollm2-135m", dtype="float64", num_layers=1)
