"""Valid random blocks of the K types (Q4_K, Q5_K, Q6_K: super-blocks of 256), for checking the
kernels: gguf-py dequantizes these types but cannot quantize them. Quant bytes are random, the fp16
scales finite and positive (the int8 / 6-bit scales random too), so every bit of the layout is
exercised; `gguf.quants.dequantize` of the bytes is the reference. numpy only.
"""
from __future__ import annotations

import numpy as np

Q4_K, Q5_K, Q6_K = 12, 13, 14  # gguf's GGMLQuantizationType values
K_BLOCK = 256
K_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210}
_HALVES = {Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}  # byte offsets of the fp16 d (and dmin) in a block


def random_k_blocks(qtype: int, out_f: int, in_f: int, seed: int) -> np.ndarray:
    """uint8 `[out_f, in_f / 256 * bytes]` of random valid `qtype` super-blocks (in_f a multiple of 256)."""
    if qtype not in K_BYTES or in_f % K_BLOCK:
        raise ValueError(f"no K type {qtype} or in_f {in_f} is not a multiple of {K_BLOCK}")
    rng = np.random.default_rng(seed)
    nb, size = in_f // K_BLOCK, K_BYTES[qtype]
    raw = rng.integers(0, 256, (out_f * nb, size), dtype=np.uint8)
    # scales such that the weights come out of order 1: 1 / (largest scale x largest quant)
    top = {Q4_K: 63 * 15, Q5_K: 63 * 31, Q6_K: 127 * 32}[qtype]
    for off in _HALVES[qtype]:
        half = (rng.uniform(0.2, 2.0, out_f * nb) / top).astype(np.float16)
        raw[:, off:off + 2] = half.view(np.uint8).reshape(-1, 2)
    return raw.reshape(out_f, nb * size)
