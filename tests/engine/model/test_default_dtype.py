"""The CPU's default dtype follows the file: `gguf` when every layer's matmul weight is in a type the
quantized kernels take, float32 for float files, synthetic models and mixes with other types; a model
loaded without a dtype says which path its matmuls run."""
from __future__ import annotations

import pytest
from tiny_models import Tiny, write_tiny

from pdtop.engine.build import default_dtype, load_for
from pdtop.engine.model import quant_kernels
from pdtop.engine.model.loader import blocks_by_default
from pdtop.engine.runtime.runner import ModelRunner

LAYER_MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dtypes")
    kinds = {
        "f32": {},
        "f16": dict.fromkeys(LAYER_MATS, "F16"),
        "q8_0": {**dict.fromkeys(LAYER_MATS, "Q8_0"), "token_embd": "Q8_0"},
        "q4_1_f32_embedding": dict.fromkeys(LAYER_MATS, "Q4_1"),  # the embedding's type does not decide
        "mixed": {**dict.fromkeys(LAYER_MATS, "Q8_0"), "ffn_down": "F16"},
    }
    out = {}
    for name, types in kinds.items():
        out[name] = d / f"{name}.gguf"
        write_tiny(out[name], Tiny(), types=types)
    return out


@pytest.mark.parametrize("name,want", [("f32", "float32"), ("f16", "float32"), ("q8_0", "gguf"),
                                       ("q4_1_f32_embedding", "gguf"), ("mixed", "float32")])
def test_the_cpu_default_follows_the_files_matmul_types(files, name, want):
    assert default_dtype("cpu", str(files[name])) == want
    assert default_dtype("cuda", str(files[name])) == "bfloat16"  # CUDA's default is unchanged


def test_no_file_synthetic_and_unreadable_files_default_to_float32(tmp_path):
    assert default_dtype("cpu") == "float32"
    assert default_dtype("cpu", "synthetic:smollm2-135m") == "float32"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert not blocks_by_default(bad)  # its load says why, as before
    assert default_dtype("cpu", str(bad)) == "float32"


def test_the_shipped_model_defaults_to_gguf(gguf_path):
    assert default_dtype("cpu", str(gguf_path)) == "gguf"


def test_a_model_loaded_without_dtype_says_what_runs(files):
    """`load_for` is what `build_engine` loads (the tiny files have no tokenizer for a whole engine)."""
    if quant_kernels.kernels() is None:
        pytest.skip("no C compiler / OpenMP runtime for the quantized kernels here")
    for name, start in (("q8_0", "gguf Q8_0 ("), ("f32", "float32")):
        runtime = ModelRunner(load_for("cpu", str(files[name])), kv_capacity_tokens=64).describe()
        assert runtime["weights"].startswith(start), runtime["weights"]
        assert runtime["dtype"] == "float32"  # activations and KV stay float32 on the blocks
