"""Model breadth: tiny Llama / Llama 3.x (RoPE scaling) / Qwen2 / Qwen3 GGUFs written in the
test, loaded by pdtop, and their logits checked against a float64 textbook forward pass
on the original HF-layout weights, and against HF transformers where it is installed."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from tiny_models import (
    TINY,
    gguf_tensors,
    hf_logits,
    hf_weights,
    llama3_rope_divisors,
    pdtop_logits,
    reference_logits,
    write_gguf,
    write_tiny,
)

from pdtop.engine.errors import UnsupportedModelError
from pdtop.engine.model import rope
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.model.loader import load_model, read_config

PROMPT_LENGTHS = (1, 9, 24)


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, n).tolist() for n in PROMPT_LENGTHS]


def assert_logits_close(ours: torch.Tensor, want: torch.Tensor) -> None:
    want = want.to(torch.float32)
    # float32 through oneDNN against float64 / float32 eager: agree to rounding, far below the logits' spread
    err = float((ours - want).abs().max())
    assert err < 1e-5 * max(1.0, float(want.abs().max())), f"max |diff| {err}"
    assert ours.argmax() == want.argmax()


@pytest.fixture(scope="module", params=list(TINY))
def tiny(request, tmp_path_factory):
    """(kind, spec, HF weights, loaded pdtop model) for each tiny architecture."""
    kind = request.param
    t = TINY[kind]
    path = tmp_path_factory.mktemp(kind) / f"{kind}.gguf"
    w = write_tiny(path, t)
    return kind, t, w, path, load_model(path)


def test_config_read_from_metadata(tiny):
    _, t, _, path, model = tiny
    cfg = read_config(path)
    assert cfg == model.config
    assert (cfg.arch, cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.ffn,
            cfg.vocab) == (t.arch, t.layers, t.hidden, t.heads, t.kv_heads, t.head_dim, t.ffn, t.vocab)
    assert (cfg.attn_bias, cfg.qk_norm, cfg.tie_embeddings, cfg.rope_theta) == (t.bias, t.qk_norm, t.tied, t.theta)


def test_logits_match_textbook_forward(tiny):
    _, t, w, _, model = tiny
    for ids in prompts(t.vocab):
        assert_logits_close(pdtop_logits(model, ids), reference_logits(t, w, ids))


def test_logits_match_transformers(tiny):
    _, t, w, _, model = tiny
    for ids in prompts(t.vocab, seed=1):
        assert_logits_close(pdtop_logits(model, ids), hf_logits(t, w, ids))


def test_bfloat16_and_a_short_generation(tiny):
    _, t, _, path, _ = tiny
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner
    from pdtop.engine.scheduling.tokens import generate

    m = load_model(path, dtype="bfloat16", num_layers=1)
    assert m.num_layers == 1 and m.dtype == torch.bfloat16
    r = ModelRunner(m, kv_capacity_tokens=64)
    seq = Request(0, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    assert list(generate(r, seq)) == seq.output_ids
    assert len(seq.output_ids) == 4 and all(0 <= i < t.vocab for i in seq.output_ids)


def test_llama3_scaling_changes_these_logits():
    """Guards the checks above: in the tiny llama3 setup the scaling moves the logits well past
    the tolerance, so a loader that ignored rope_freqs would fail them."""
    t = TINY["llama3"]
    w = hf_weights(t)
    ids = prompts(t.vocab)[-1]
    diff = (reference_logits(t, w, ids) - reference_logits(t, w, ids, scaled_rope=False)).abs().max()
    assert diff > 100 * 1e-5 * reference_logits(t, w, ids).abs().max()


def test_synthetic_llama31_scaling_is_llama_cpps():
    """The synthetic Llama 3.1 config's HF-style scaling gives the divisors llama.cpp's converter stores."""
    cfg = synthetic_config("llama3.1-8b")
    s = cfg.rope_scaling
    t = replace(TINY["llama3"], head_dim=cfg.head_dim, theta=cfg.rope_theta,
                llama3_rope=(s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context))
    plain = rope.inv_freq(replace(cfg, rope_scaling=None))
    np.testing.assert_allclose((plain / rope.inv_freq(cfg)).numpy(), llama3_rope_divisors(t), rtol=1e-5)


def test_linear_rope_scaling(tmp_path):
    t = replace(TINY["llama"], layers=1, extra_meta={"llama.rope.scaling.type": "linear",
                                                     "llama.rope.scaling.factor": 4.0})
    path = tmp_path / "linear.gguf"
    write_tiny(path, t)
    plain = tmp_path / "plain.gguf"
    write_tiny(plain, replace(t, extra_meta={}))
    assert torch.allclose(load_model(path).inv_freq * 4, load_model(plain).inv_freq)


@pytest.mark.parametrize("meta, tensor, match", [
    ({"llama.rope.scaling.type": "yarn"}, None, "RoPE scaling 'yarn' is not supported"),
    ({}, "blk.0.ffn_up.bias", r"tensor blk\.0\.ffn_up\.bias belongs to a model variant that is not supported"),
    ({"llama.expert_count": 8}, None, "mixture-of-experts"),
])
def test_unsupported_variants_refused_in_one_line(tmp_path, meta, tensor, match):
    t = replace(TINY["llama"], layers=1, extra_meta=meta)
    w = hf_weights(t)
    tensors = gguf_tensors(t, w)
    if tensor:
        tensors[tensor] = np.zeros(t.ffn, dtype=np.float32)
    path = tmp_path / "variant.gguf"
    write_gguf(path, t, tensors)
    with pytest.raises(UnsupportedModelError, match=match) as exc:
        load_model(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)
