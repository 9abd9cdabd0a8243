"""A GGUF tensor kept as its quantized blocks (for `--dtype gguf`), between the file and the model.

numpy only (the loader reads configs without torch); `quant_linear.QuantWeight` is the torch form.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from pdtop.engine.model.gguf_file import GGUFFile, TensorInfo

# the types csrc/quant.c and csrc/quant_k.c compute on (quant_kernels.QUANT_TYPES)
Q = GGMLQuantizationType
KEPT_TYPES = frozenset(int(t) for t in (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K))
# the matmul weights (and the embedding, tied to the LM head or not) that stay as blocks
KEPT_PARTS = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                        "token_embd", "output"})


@dataclass
class RawBlocks:
    raw: np.ndarray         # uint8 [out, row_bytes], a private copy (not a view of the file's map)
    qtype: int
    shape: tuple[int, ...]  # the weight's logical [out, in]


def kept(f: GGUFFile, info: TensorInfo) -> RawBlocks | None:
    """The tensor as blocks when the kernels take its type and it is a matmul weight, else None.

    Called only to keep blocks (`--dtype gguf`, the kernels loaded): a type whose kernel failed its
    load-time check (`quant_kernels.kernels().types`) loads as float32."""
    parts = info.name.split(".")
    part = parts[2] if parts[0] == "blk" and len(parts) == 4 else parts[0]
    if info.qtype not in KEPT_TYPES or part not in KEPT_PARTS or len(info.shape) != 2:
        return None
    from pdtop.engine.model import quant_kernels  # torch: imported only when blocks are kept

    k = quant_kernels.kernels()
    if k is None or info.qtype not in k.types or info.shape[1] % quant_kernels.block_len(info.qtype):
        return None
    return RawBlocks(np.array(f.raw(info)), info.qtype, info.shape)
