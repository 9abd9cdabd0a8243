"""`--dtype gguf` end to end on the real SmolLM2 requantized (`requant.py`): all its matmul weights and the
embedding as Q5_0, as Q5_1, and its ffn_down (in 1536, the only rows a multiple of 256: hidden 576 is
not) as Q4_K / Q5_K / Q6_K by layer. Each file's greedy answers on the blocks agree with the same file
loaded as float32, up to a near-tie (test_quant_kernels' tolerance); a type whose kernel is missing
loads as float32."""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from requant import requantize
from test_quant_kernels import NEAR_TIE, chat_ids, greedy, prompt_logits

from pdtop.engine.model import quant_kernels
from pdtop.engine.model.linear import Linear
from pdtop.engine.model.loader import load_model
from pdtop.engine.model.quant_linear import QuantLinear
from pdtop.engine.runtime.runner import ModelRunner

K_BY_LAYER = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
PROMPTS = ["What is the capital of France?", "Name three colours of the rainbow."]


def k_down(name: str, shape: tuple[int, ...]) -> int | None:
    """ffn_down of layer i as K_BY_LAYER[i % 3], the rest as stored."""
    parts = name.split(".")
    return int(K_BY_LAYER[int(parts[1]) % 3]) if name.endswith("ffn_down.weight") else None


FILES = {
    "Q5_0": lambda name, shape: int(Q.Q5_0),
    "Q5_1": lambda name, shape: int(Q.Q5_1),
    "K": k_down,
}


@pytest.fixture(scope="module")
def requantized_file(gguf_path, tmp_path_factory):
    """`f(name)`: the shipped file requantized as FILES[name], written once per module."""
    k = quant_kernels.kernels()
    if k is None or k.types != frozenset(quant_kernels.QUANT_TYPES):
        pytest.skip("the quantized kernels (all types) are unavailable here")
    where, done = tmp_path_factory.mktemp("requant"), {}

    def make(name: str) -> Path:
        if name not in done:
            done[name] = requantize(gguf_path, where / f"{name}.gguf", FILES[name])
        return done[name]

    return make


@pytest.fixture(scope="module", params=sorted(FILES))
def requantized(request, requantized_file):
    path = requantized_file(request.param)
    return request.param, path, load_model(path, dtype="gguf"), load_model(path, dtype="float32")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_answer_on_the_blocks_matches_float32_up_to_a_near_tie(requantized, tokenizer, prompt):
    _, _, model_gguf, model_f32 = requantized
    ids = chat_ids(tokenizer, prompt)
    q, f = greedy(model_gguf, ids, 24), greedy(model_f32, ids, 24)
    k = next((i for i, (a, b) in enumerate(zip(q, f, strict=False)) if a != b), None)
    if k is None:
        assert q == f
        return
    logits = prompt_logits(model_f32, ids + f[:k], [])
    gap = float(logits[f[k]] - logits[q[k]])
    assert 0 <= gap < NEAR_TIE, (k, tokenizer.decode(f[:k + 1]), tokenizer.decode(q[:k + 1]), gap)


def test_the_blocks_are_kept_and_described(requantized):
    name, _, model_gguf, _ = requantized
    quant = [m for m in model_gguf.modules() if isinstance(m, QuantLinear)]
    assert len(quant) == 4 * model_gguf.num_layers + 1  # qkv, o, gate_up, down, and the tied LM head
    weights = ModelRunner(model_gguf, kv_capacity_tokens=64).describe()["weights"]
    if name == "K":
        downs = [layer.mlp.down.weight.type_name for layer in model_gguf.decoder_layers]
        assert downs == [K_BY_LAYER[i % 3].name for i in range(model_gguf.num_layers)]
        assert weights.startswith("gguf Q4_1+Q4_K+Q5_K+Q6_K+Q8_0 (")
    else:
        assert {m.weight.type_name for m in quant} == {name} and model_gguf.embed_weight.type_name == name
        assert weights.startswith(f"gguf {name} (") and weights.endswith(("avx2)", "avx512-vnni)", "portable)"))


def test_a_type_without_its_kernel_loads_as_float32(requantized_file, monkeypatch):
    k = quant_kernels.kernels()
    path = requantized_file("K")
    without = quant_kernels.QuantKernels(k.lib, k.fast, k.lib_k, k.fast_k, k.types - {int(Q.Q6_K)})
    monkeypatch.setattr(quant_kernels, "kernels", lambda: without)  # as if Q6_K had failed its load-time check
    model = load_model(path, dtype="gguf", num_layers=6)
    downs = [layer.mlp.down for layer in model.decoder_layers]
    assert [type(d) for d in downs] == [QuantLinear, QuantLinear, Linear] * 2
    assert [d.weight.type_name for d in downs if isinstance(d, QuantLinear)] == ["Q4_K", "Q5_K"] * 2
