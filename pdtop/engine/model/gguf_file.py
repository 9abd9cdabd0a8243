"""The one GGUF reader: metadata, tensor directory, and raw tensor bytes.

`gguf.GGUFReader` builds a numpy view for every string in the file, about two
seconds for SmolLM2's 49152 tokens and 48900 merges on a small CPU (0.7 s over a
plain view of its memory map). This reader unpacks the key/value section with
`struct` (about 0.1 s for the same file) and the tensor directory after it; tensor
bytes are views of one read-only memory map, handed to `gguf.quants.dequantize`.
The value-type codes, the magic and the block sizes come from `gguf`. Both byte
orders are read; tensors of big-endian files are refused by the loader.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from pdtop.engine.errors import ModelFileError

_VT = GGUFValueType
_SCALAR_FORMATS: dict[int, str] = {
    _VT.UINT8: "B", _VT.INT8: "b", _VT.UINT16: "H", _VT.INT16: "h",
    _VT.UINT32: "I", _VT.INT32: "i", _VT.FLOAT32: "f", _VT.BOOL: "?",
    _VT.UINT64: "Q", _VT.INT64: "q", _VT.FLOAT64: "d",
}
MAX_DIMS = 8  # GGML has 4; anything past this is a corrupt count, not a tensor


class _Corrupt(Exception):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # PyTorch order: outermost first (GGUF lists ne0, the row length, first)
    qtype: int              # a GGMLQuantizationType value (may be one this `gguf` does not know)
    offset: int             # absolute byte offset in the file

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type {self.qtype}"

    @property
    def row_bytes(self) -> int | None:
        """Bytes per row (last dimension), or None for an unknown type or a partial block."""
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.qtype)]
        except (ValueError, KeyError):
            return None
        row = self.shape[-1] if self.shape else 1
        return None if row % block else row // block * size

    @property
    def n_bytes(self) -> int | None:
        row = self.row_bytes
        return None if row is None else row * int(np.prod(self.shape[:-1], dtype=np.int64))


@dataclass
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    little_endian: bool = True
    _data: np.ndarray | None = field(default=None, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes as `uint8 [*shape[:-1], row_bytes]`, the form `gguf.quants.dequantize` takes."""
        row = info.row_bytes
        if row is None:
            raise ModelFileError(f"{self.path}: tensor {info.name} ({info.type_name}, shape {info.shape}) "
                                 "has no whole number of blocks per row")
        if self._data is None:
            # A plain view of the map, not the `np.memmap`: slicing a memmap runs
            # `__array_finalize__` per slice. The map lives as long as a view of it.
            self._data = np.asarray(np.memmap(self.path, dtype=np.uint8, mode="r"))
        n = row * int(np.prod(info.shape[:-1], dtype=np.int64))
        return self._data[info.offset:info.offset + n].reshape(*info.shape[:-1], row)


def read_gguf(path: str | os.PathLike, tensors: bool = True) -> GGUFFile:
    """Metadata (and, with `tensors`, the tensor directory) of a GGUF v2/v3 file.

    One-line `ModelFileError`s name the file: missing, not a file, unreadable, bad magic,
    unsupported version, truncated or corrupt.
    """
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{path}: model file not found")
    if not path.is_file():
        raise ModelFileError(f"{path}: not a file")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8 or struct.unpack_from("<I", head)[0] != GGUF_MAGIC:
                raise ModelFileError(f"{path}: not a GGUF file (bad magic)")
            order = "<"
            version = struct.unpack_from("<I", head, 4)[0]
            if version & 0xFFFF == 0:  # written on a machine of the other byte order
                order, version = ">", struct.unpack_from(">I", head, 4)[0]
            if version not in (2, 3):
                raise ModelFileError(f"{path}: unsupported GGUF version {version} (need 2 or 3)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                try:
                    return _parse(buf, order, path, tensors)
                except (_Corrupt, struct.error, UnicodeDecodeError):
                    raise ModelFileError(f"{path}: truncated or corrupt GGUF (ends inside its header)") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read model file ({e.strerror})") from None


def _parse(buf: mmap.mmap, order: str, path: Path, with_tensors: bool) -> GGUFFile:
    end = len(buf)
    off = 8
    n_tensors, n_kv = struct.unpack_from(order + "QQ", buf, off)
    off += 16

    def read_str() -> str:
        nonlocal off
        (n,) = struct.unpack_from(order + "Q", buf, off)
        off += 8
        if off + n > end:
            raise _Corrupt
        s = buf[off:off + n].decode("utf-8", errors="replace")
        off += n
        return s

    def read_value(vtype: int) -> Any:
        nonlocal off
        if vtype == _VT.STRING:
            return read_str()
        if vtype == _VT.ARRAY:
            etype, n = struct.unpack_from(order + "IQ", buf, off)
            off += 12
            if etype in _SCALAR_FORMATS:
                fmt = f"{order}{n}{_SCALAR_FORMATS[etype]}"
                size = struct.calcsize(fmt)
                if off + size > end:
                    raise _Corrupt
                values = list(struct.unpack_from(fmt, buf, off))
                off += size
                return values
            if n > end - off:  # every element takes at least one byte
                raise _Corrupt
            return [read_value(etype) for _ in range(n)]
        code = _SCALAR_FORMATS.get(vtype)
        if code is None:
            raise _Corrupt
        (v,) = struct.unpack_from(order + code, buf, off)
        off += struct.calcsize(code)
        return v

    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = read_str()
        (vtype,) = struct.unpack_from(order + "I", buf, off)
        off += 4
        meta[key] = read_value(vtype)
    result = GGUFFile(path=path, metadata=meta, little_endian=order == "<")
    if not with_tensors:
        return result
    if n_tensors > (end - off) // 24:  # each entry takes at least 24 bytes
        raise _Corrupt
    infos = []
    for _ in range(n_tensors):
        name = read_str()
        (n_dims,) = struct.unpack_from(order + "I", buf, off)
        if n_dims > MAX_DIMS:
            raise _Corrupt
        dims = struct.unpack_from(f"{order}{n_dims}Q", buf, off + 4)
        qtype, rel = struct.unpack_from(order + "IQ", buf, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        infos.append((name, tuple(int(d) for d in reversed(dims)), qtype, rel))
    align = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0:
        raise ModelFileError(f"{path}: corrupt GGUF (general.alignment = {align!r})")
    data_start = -(-off // align) * align
    for name, shape, qtype, rel in infos:
        info = TensorInfo(name, shape, qtype, data_start + rel)
        n = info.n_bytes
        if n is not None and info.offset + n > end:
            raise ModelFileError(f"{path}: truncated GGUF (tensor {name} ends past the end of the file)")
        result.tensors[name] = info
    return result
