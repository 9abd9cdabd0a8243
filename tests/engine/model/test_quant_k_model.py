"""`--dtype gguf` end to end on the real SmolLM2 requantized once (`requant.py`) to every type the kernels
add: attention and the embedding as Q5_0, gate/up as Q5_1, and ffn_down (in 1536, the only rows a
multiple of 256: hidden 576 is not) as Q4_K / Q5_K / Q6_K by layer. Greedy answers on the blocks agree
with the same file loaded as float32, up to a near-tie (test_quant_kernels' tolerance); a type whose
kernel is missing loads as float32. One file, not one per type: each requantization and load pair costs
CI about a minute on 2 cores."""
from __future__ import annotations

import pytest
from chat_prompts import chat_ids, prompt_logits
from gguf import GGMLQuantizationType as Q
from requant import requantize
from test_quant_kernels import NEAR_TIE, greedy

from pdtop.engine.model import quant_kernels
from pdtop.engine.model.linear import Linear
from pdtop.engine.model.loader import load_model
from pdtop.engine.model.quant_linear import QuantLinear
from pdtop.engine.runtime.runner import ModelRunner

K_BY_LAYER = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
PROMPTS = ["What is the capital of France?", "Name three colours of the rainbow."]
# The K types' activations are rounded per 256 (llama.cpp's Q8_K), not per 32: on SmolLM2's real ffn_down
# inputs a matmul is 0.72% off the float one against 0.31% per 32, so a tie is about twice as wide
# (the rainbow prompt's "colours:" is followed by "\n\n" at 0.53 ahead of " blue").
K_NEAR_TIE = 2 * NEAR_TIE


def mixed(name: str, shape: tuple[int, ...]) -> int | None:
    """The type each tensor is requantized to (None: the norms, kept as stored)."""
    parts = name.split(".")
    if name.endswith("ffn_down.weight"):
        return int(K_BY_LAYER[int(parts[1]) % 3])
    if name.endswith(("ffn_gate.weight", "ffn_up.weight")):
        return int(Q.Q5_1)
    if name.startswith("token_embd") or ".attn_" in name:  # (the norms are 1-d: not asked)
        return int(Q.Q5_0)
    return None


@pytest.fixture(scope="module")
def requantized_file(gguf_path, tmp_path_factory):
    k = quant_kernels.kernels()
    if k is None or k.types != frozenset(quant_kernels.QUANT_TYPES):
        pytest.skip("the quantized kernels (all types) are unavailable here")
    return requantize(gguf_path, tmp_path_factory.mktemp("requant") / "mixed.gguf", mixed)


@pytest.fixture(scope="module")
def requantized(requantized_file):
    return load_model(requantized_file, dtype="gguf"), load_model(requantized_file, dtype="float32")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_answer_on_the_blocks_matches_float32_up_to_a_near_tie(requantized, tokenizer, prompt):
    model_gguf, model_f32 = requantized
    ids = chat_ids(tokenizer, prompt)
    q, f = greedy(model_gguf, ids, 24), greedy(model_f32, ids, 24)
    k = next((i for i, (a, b) in enumerate(zip(q, f, strict=False)) if a != b), None)
    if k is None:
        assert q == f
        return
    logits = prompt_logits(model_f32, ids + f[:k], [])
    gap = float(logits[f[k]] - logits[q[k]])
    assert 0 <= gap < K_NEAR_TIE, (k, tokenizer.decode(f[:k + 1]), tokenizer.decode(q[:k + 1]), gap)


def test_the_blocks_are_kept_and_described(requantized):
    model_gguf, _ = requantized
    quant = [m for m in model_gguf.modules() if isinstance(m, QuantLinear)]
    assert len(quant) == 4 * model_gguf.num_layers + 1  # qkv, o, gate_up, down, and the tied LM head
    layers = model_gguf.decoder_layers
    assert [layer.mlp.down.weight.type_name for layer in layers] == [K_BY_LAYER[i % 3].name for i in range(len(layers))]
    others = {m.weight.type_name for m in quant} - {t.name for t in K_BY_LAYER}
    assert others == {"Q5_0", "Q5_1"} and model_gguf.embed_weight.type_name == "Q5_0"
    weights = ModelRunner(model_gguf, kv_capacity_tokens=64).describe()["weights"]
    assert weights.startswith("gguf Q4_K+Q5_0+Q5_1+Q5_K+Q6_K (")


def test_a_type_without_its_kernel_loads_as_float32(requantized_file, monkeypatch):
    k = quant_kernels.kernels()
    path = requantized_file
    without = quant_kernels.QuantKernels(k.lib, k.fast, k.lib_k, k.fast_k, k.types - {int(Q.Q6_K)})
    monkeypatch.setattr(quant_kernels, "kernels", lambda: without)  # as if Q6_K had failed its load-time check
    model = load_model(path, dtype="gguf", num_layers=6)
    downs = [layer.mlp.down for layer in model.decoder_layers]
    assert [type(d) for d in downs] == [QuantLinear, QuantLinear, Linear] * 2
    assert [d.weight.type_name for d in downs if isinstance(d, QuantLinear)] == ["Q4_K", "Q5_K"] * 2
