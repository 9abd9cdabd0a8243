"""Model shapes: read from a GGUF's metadata, or named synthetic configurations.

Synthetic models have the real shapes of larger models and seeded random weights,
so timing runs are meaningful where real weights cannot be downloaded.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.errors import UnsupportedModelError


@dataclass(frozen=True)
class RopeScaling:
    """Stretching RoPE to longer contexts, as HF's `rope_scaling` says (see `rope.py`)."""
    kind: str                       # "linear" or "llama3"
    factor: float
    low_freq_factor: float = 1.0    # llama3 only
    high_freq_factor: float = 4.0   # llama3 only
    original_context: int = 8192    # llama3 only: the context the model was pre-trained with


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False  # Qwen3 normalizes q and k per head before RoPE
    attn_bias: bool = False  # Qwen2 adds biases to q, k and v
    rope_scaling: RopeScaling | None = None
    arch: str = "llama"      # the GGUF `general.architecture` this config came from
    max_context: int = 8192
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()

    @property
    def linear_params_per_layer(self) -> int:
        q_o = 2 * self.hidden * self.num_heads * self.head_dim
        k_v = 2 * self.hidden * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.ffn
        return q_o + k_v + mlp

    @property
    def linear_params(self) -> int:
        """Parameters of every layer's linear layers plus the LM head (the seed's LINEAR)."""
        return self.num_layers * self.linear_params_per_layer + self.hidden * self.vocab

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


SYNTHETIC: dict[str, ModelConfig] = {
    "qwen3-8b": ModelConfig(
        name="synthetic:qwen3-8b", num_layers=36, hidden=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, ffn=12288, vocab=151936, rope_theta=1e6, rms_eps=1e-6, qk_norm=True,
        max_context=40960, eos_ids=(151645,), arch="qwen3",
    ),
    "llama3.1-8b": ModelConfig(
        name="synthetic:llama3.1-8b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, ffn=14336, vocab=128256, rope_theta=5e5, max_context=131072,
        bos_id=128000, eos_ids=(128009,), rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
    ),
    "smollm2-135m": ModelConfig(
        name="synthetic:smollm2-135m", num_layers=30, hidden=576, num_heads=9, num_kv_heads=3,
        head_dim=64, ffn=1536, vocab=49152, rope_theta=1e5, tie_embeddings=True, max_context=8192,
        bos_id=1, eos_ids=(2,),
    ),
}


def synthetic_config(name: str) -> ModelConfig:
    """`qwen3-8b` or `synthetic:qwen3-8b` -> its config; unknown names list the known ones."""
    key = name.removeprefix("synthetic:")
    if key not in SYNTHETIC:
        known = ", ".join("synthetic:" + k for k in SYNTHETIC)
        raise UnsupportedModelError(f"unknown synthetic model {name!r}; known: {known}")
    return SYNTHETIC[key]

