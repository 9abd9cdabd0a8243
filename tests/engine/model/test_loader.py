"""GGUF loading: metadata, every tensor type gguf.quants dequantizes, Q/K layout, bad files."""
from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from tiny_models import TINY, gguf_tensors, hf_weights, write_gguf, write_tiny

from pdtop.engine.errors import EngineError, ModelFileError, UnsupportedModelError
from pdtop.engine.model.loader import default_model_path, load_gguf, load_model, read_config, supported_types
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import generate

Q = gguf.GGMLQuantizationType
TINY1 = replace(TINY["llama"], layers=1)
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def q6_k_constant(rows: int, cols: int, d: float, scale: int, q: int) -> np.ndarray:
    """Q6_K blocks whose every weight is d * scale * (q - 32): ql low/high nibbles and qh pairs all hold q."""
    block = np.zeros(210, dtype=np.uint8)
    lo, hi = q & 0xF, q >> 4
    block[:128] = lo | (lo << 4)
    block[128:192] = hi | (hi << 2) | (hi << 4) | (hi << 6)
    block[192:208] = np.array([scale] * 16, dtype=np.int8).view(np.uint8)
    block[208:210] = np.array([d], dtype=np.float16).view(np.uint8)
    return np.tile(block, (rows, cols // 256))


def test_the_model_is_named_as_its_publisher_spells_it(gguf_path, tmp_path):
    assert gguf.GGUFReader(gguf_path).fields["general.name"].contents() == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert read_config(gguf_path).name == "SmolLM2-135M-Instruct"  # the file's name, its basename in it
    path = tmp_path / "tiny-llama-F32.gguf"
    write_tiny(path, TINY1)  # no general.* names at all: the file's name without its type tag
    assert read_config(path).name == "tiny-llama"


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


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"])
def test_quantized_weights_keep_their_values_and_llama_qk_stays_as_stored(tmp_path, kind):
    path = tmp_path / f"tiny-{kind}.gguf"
    w = write_tiny(path, TINY["llama"], types=dict.fromkeys(MATRICES, kind))
    loaded = load_gguf(path)
    assert loaded.config.num_layers == TINY["llama"].layers and loaded.config.tie_embeddings
    # quantization error bound per type (the weights have std 0.05, |w| < 0.3); Q and K are compared
    # in the stored (llama.cpp, adjacent-pair) layout, which the model uses as is
    tol = {"F32": 0, "F16": 2e-4, "BF16": 2e-3, "Q8_0": 3e-3, "Q5_1": 0.015, "Q5_0": 0.025, "Q4_1": 0.03,
           "Q4_0": 0.05}[kind]
    for name, orig in gguf_tensors(TINY["llama"], w).items():
        err = np.abs(loaded.tensors[name] - orig).max()
        assert err <= tol, f"{name}: max error {err} > {tol}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random bits make some float16 scales NaN or inf
@pytest.mark.parametrize("kind", supported_types())
def test_every_type_gguf_dequantizes_loads_as_gguf_dequantizes_it(tmp_path, kind):
    """Random raw blocks of each type (K-quants, IQ, ternary, FP4 included) through the loader,
    bit for bit as `gguf.quants.dequantize` decodes the same bytes."""
    qtype = Q[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    tensors = gguf_tensors(TINY1, hf_weights(TINY1))
    raw = {}
    for name, arr in tensors.items():
        if arr.ndim == 2 and name.split(".")[-2] in MATRICES:
            rows, cols = arr.shape
            raw[name] = (rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8), qtype)
    path = tmp_path / f"raw-{kind}.gguf"
    write_gguf(path, TINY1, tensors, raw=raw)
    loaded = load_gguf(path)
    for name, (blocks, _) in raw.items():
        want = dequantize(blocks, qtype)
        assert loaded.tensors[name].shape == want.shape == tensors[name].shape
        np.testing.assert_array_equal(loaded.tensors[name], want, err_msg=name)


def test_k_quants_are_among_the_types():
    assert {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "BF16", "F16", "F32"} <= set(supported_types())


def test_q6_k_and_tiny_model_runs(tmp_path):
    path = tmp_path / "tiny-q6k.gguf"
    tensors = gguf_tensors(TINY["llama"], hf_weights(TINY["llama"]))
    raw = {n: (q6_k_constant(*a.shape, d=0.5, scale=3, q=33), Q.Q6_K) for n, a in tensors.items()
           if n.endswith("ffn_down.weight")}
    write_gguf(path, TINY["llama"], tensors, raw=raw)
    loaded = load_gguf(path)
    assert np.all(loaded.tensors["blk.0.ffn_down.weight"] == 1.5)
    model = load_model(path)
    runner = ModelRunner(model, kv_capacity_tokens=64)
    seq = Request(0, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    assert list(generate(runner, seq)) == seq.output_ids
    assert len(seq.output_ids) == 4 and all(0 <= t < TINY["llama"].vocab for t in seq.output_ids)


def test_unsupported_tensor_type(tmp_path):
    path = tmp_path / "i8.gguf"
    tensors = gguf_tensors(TINY1, hf_weights(TINY1))
    tensors["blk.0.ffn_up.weight"] = np.zeros(tensors["blk.0.ffn_up.weight"].shape, dtype=np.int8)  # stored as I8
    write_gguf(path, TINY1, tensors)
    with pytest.raises(UnsupportedModelError, match=r"i8\.gguf: tensor blk\.0\.ffn_up\.weight has unsupported "
                                                     r"type I8 \(supported: F32, F16, .*Q4_K"):
        load_gguf(path)


def test_unsupported_architecture(mamba_gguf):
    path = mamba_gguf
    with pytest.raises(UnsupportedModelError) as exc:
        load_model(path)
    msg = str(exc.value)
    assert str(path) in msg and "'mamba'" in msg and "supported: llama, qwen2, qwen3" in msg and "\n" not in msg


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


def test_reading_a_models_config_loads_no_torch(gguf_path):
    """`pdtop kv` reads a GGUF's metadata only: no weights, and no torch (it took 2.8 s to import)."""
    import subprocess
    import sys

    code = ("import sys\nfrom pdtop.engine.model.loader import read_config\n"
            f"cfg = read_config({str(gguf_path)!r})\nprint(cfg.num_layers, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["30", "False"]
