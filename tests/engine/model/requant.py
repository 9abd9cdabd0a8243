"""Test helpers: simple numpy quantizers for Q4_K, Q5_K and Q6_K (gguf-py dequantizes these but cannot
quantize them; plain min/max scales, not llama.cpp's search) and `requantize`, a copy of a GGUF with
chosen tensors requantized (gguf-py's own quantizer for the types it has)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

Q = gguf.GGMLQuantizationType


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(b > 0, a / np.where(b > 0, b, 1), 0)


def quantize_k(w: np.ndarray, qtype: int) -> np.ndarray:
    """uint8 `[out, in / 256 * bytes]` blocks of `w` (float32 `[out, in]`, in a multiple of 256)."""
    out_f = w.shape[0]
    x = w.astype(np.float32).reshape(-1, 256)
    if qtype == Q.Q6_K:
        return _q6_k(x).reshape(out_f, -1)
    bits = 5 if qtype == Q.Q5_K else 4
    qmax = (1 << bits) - 1
    sub = x.reshape(-1, 8, 32)
    lo, hi = np.minimum(sub.min(-1), 0), sub.max(-1)
    scale = (hi - lo) / qmax
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_div(-lo, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    q = np.clip(np.rint(_div(sub + (dmin[:, None] * mn)[..., None], step[..., None])), 0, qmax).astype(np.uint8)
    scales = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6), (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)], axis=1)
    q = q.reshape(-1, 4, 2, 32)  # chunk c: sub-blocks 2c (low nibbles), 2c + 1 (high)
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    parts = [_f16(d), _f16(dmin), scales]
    if bits == 5:
        qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
        for s in range(8):
            qh |= ((q[:, s // 2, s % 2] >> 4) & 1) << s
        parts.append(qh)
    return np.concatenate([*parts, qs], axis=1).reshape(out_f, -1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    groups = x.reshape(-1, 16, 16)
    scale = np.abs(groups).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(_div(scale, d[:, None])), -128, 127).astype(np.int8)
    step = d[:, None] * sc
    q = (np.clip(np.rint(_div(groups, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
    qh = sum(((q[:, :, k] >> 4) & 3) << (2 * k) for k in range(4)).astype(np.uint8).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)], axis=1)


def requantize(src: Path, dst: Path, choose: Callable[[str, tuple[int, ...]], int | None]) -> Path:
    """A copy of the GGUF `src` at `dst`: metadata as is; each tensor for which `choose(name, [out, in])`
    gives a type dequantized and quantized to it, the others copied as stored."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(v) for v in reversed(t.shape))  # [out, in]
        qtype = choose(t.name, shape) if len(shape) == 2 else None
        if qtype is None:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        dense = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        raw = quantize_k(dense, qtype) if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else quantize(dense, Q(qtype))
        writer.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=Q(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
