"""Byte-level BPE tokenizer and chat template, built from a GGUF file's own metadata.

`gguf.GGUFReader` builds numpy views for every string in the file (about two
seconds for SmolLM2's 49152 tokens and 48900 merges on a small CPU), so the
metadata key/value section is parsed here directly with `struct`; the tensor
section is never touched. The value-type codes and the magic come from `gguf`.
"""

from __future__ import annotations

import codecs
import json
import mmap
import operator
import os
import struct
from datetime import datetime
from typing import Any, Callable

import gguf
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

__all__ = ["Tokenizer", "StreamDecoder"]

_VT = gguf.GGUFValueType
_SCALAR_FORMATS: dict[int, str] = {
    _VT.UINT8: "B", _VT.INT8: "b", _VT.UINT16: "H", _VT.INT16: "h",
    _VT.UINT32: "I", _VT.INT32: "i", _VT.FLOAT32: "f", _VT.BOOL: "?",
    _VT.UINT64: "Q", _VT.INT64: "q", _VT.FLOAT64: "d",
}
# llama.cpp token types (tokenizer.ggml.token_type)
_TYPE_CONTROL = 3
_TYPE_USER_DEFINED = 4


class _Truncated(Exception):
    pass


def _read_metadata(path: str) -> dict[str, Any]:
    """Key/value metadata of a GGUF file (v2/v3, either byte order); ValueError naming the file otherwise."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8 or struct.unpack_from("<I", head)[0] != gguf.GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (bad magic)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            version = struct.unpack_from("<I", buf, 4)[0]
            order = "<"
            if version & 0xFFFF == 0:  # written on a machine of the other byte order
                order, version = ">", struct.unpack_from(">I", buf, 4)[0]
            if version not in (2, 3):
                raise ValueError(f"{path}: unsupported GGUF version {version} (need 2 or 3)")
            try:
                return _parse_kv(buf, order)
            except (_Truncated, struct.error) as e:
                raise ValueError(f"{path}: truncated or corrupt GGUF metadata") from e


def _parse_kv(buf: mmap.mmap, order: str) -> dict[str, Any]:
    end = len(buf)
    off = 8
    _tensor_count, kv_count = struct.unpack_from(order + "QQ", buf, off)
    off += 16

    def read_str() -> str:
        nonlocal off
        (n,) = struct.unpack_from(order + "Q", buf, off)
        off += 8
        if off + n > end:
            raise _Truncated
        s = buf[off : off + n].decode("utf-8", errors="replace")
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
                    raise _Truncated
                values = list(struct.unpack_from(fmt, buf, off))
                off += size
                return values
            if n > end - off:  # every element takes at least one byte
                raise _Truncated
            return [read_value(etype) for _ in range(n)]
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise _Truncated
        (v,) = struct.unpack_from(order + fmt, buf, off)
        off += struct.calcsize(fmt)
        return v

    meta: dict[str, Any] = {}
    for _ in range(kv_count):
        key = read_str()
        (vtype,) = struct.unpack_from(order + "I", buf, off)
        off += 4
        meta[key] = read_value(vtype)
    return meta


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable char -> raw byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_CHAR_TO_BYTE = _byte_decoder()

# tokenizer.ggml.pre -> the Hugging Face pre-tokenizer it stands for
_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]),
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}


class StreamDecoder:
    """Incremental detokenizer: `push` returns only text whose UTF-8 bytes are complete.

    Bytes of a character split across tokens are held back until the character
    is whole; the concatenation of every `push` and the final `flush` equals
    `Tokenizer.decode` of the same ids.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], skip_ids: frozenset[int] = frozenset()):
        self._token_bytes = token_bytes
        self._skip_ids = skip_ids
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text completed by it (possibly "")."""
        if token_id in self._skip_ids:
            self._token_bytes(token_id)  # still validates the id
            return ""
        return self._utf8.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return what is held back (an incomplete sequence becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


class Tokenizer:
    """SmolLM2-style byte-level BPE with special tokens and the file's chat template."""

    def __init__(self, hf: _HFTokenizer, *, bos_id: int | None, eos_id: int, special_ids: set[int],
                 chat_template: str | None, source: str = "<memory>"):
        self._hf = hf
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.special_ids = set(special_ids)
        self.chat_template = chat_template
        self.source = source
        self._bytes_cache: dict[int, bytes] = {}
        self._template = None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "Tokenizer":
        path = os.fspath(path)
        meta = _read_metadata(path)
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ValueError(f"{path}: GGUF has no tokenizer data (tokenizer.ggml.tokens missing)")
        model = meta.get("tokenizer.ggml.model", "gpt2")
        if model != "gpt2":
            raise ValueError(f"{path}: unsupported tokenizer model {model!r} (only byte-level BPE 'gpt2')")
        pre = meta.get("tokenizer.ggml.pre", "gpt-2")
        if pre not in _PRE_TOKENIZERS:
            raise ValueError(f"{path}: unsupported pre-tokenizer {pre!r} (known: {', '.join(_PRE_TOKENIZERS)})")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise ValueError(f"{path}: GGUF has no tokenizer.ggml.merges")
        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        if eos_id is None:
            raise ValueError(f"{path}: GGUF has no tokenizer.ggml.eos_token_id")
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if len(types) != len(tokens):
            raise ValueError(f"{path}: {len(types)} token types for {len(tokens)} tokens")

        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                         merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False)
        hf = _HFTokenizer(bpe)
        hf.pre_tokenizer = _PRE_TOKENIZERS[pre]()
        hf.decoder = decoders.ByteLevel()
        special_ids = {i for i, t in enumerate(types) if t == _TYPE_CONTROL}
        added = [AddedToken(tokens[i], special=types[i] == _TYPE_CONTROL, normalized=False)
                 for i, t in enumerate(types) if t in (_TYPE_CONTROL, _TYPE_USER_DEFINED)]
        hf.add_special_tokens([a for a in added if a.special])
        hf.add_tokens([a for a in added if not a.special])
        return cls(hf, bos_id=meta.get("tokenizer.ggml.bos_token_id"), eos_id=int(eos_id),
                   special_ids=special_ids, chat_template=meta.get("tokenizer.chat_template"), source=path)

    def token(self, token_id: int) -> str:
        """The vocabulary string of one id (byte-level form, e.g. 'Ġthe')."""
        return self._hf.id_to_token(self._check_id(token_id))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it are recognised; no BOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self._hf.decode([self._check_id(i) for i in ids], skip_special_tokens=skip_special)

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self._token_bytes, frozenset(self.special_ids) if skip_special else frozenset())

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render the file's chat template with jinja2 the way transformers does."""
        if self.chat_template is None:
            raise ValueError(f"{self.source}: GGUF has no tokenizer.chat_template")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a list of dicts with a 'role' key")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        named = {name: self._hf.id_to_token(i) for name, i in
                 (("bos_token", self.bos_id), ("eos_token", self.eos_id)) if i is not None}
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **named)

    def _check_id(self, token_id: int) -> int:
        """The id as a plain int (numpy / torch ints accepted); ValueError if it is not in the vocabulary."""
        try:
            i = operator.index(token_id)
        except TypeError:
            raise ValueError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return i

    def _token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token, as the ByteLevel decoder maps them (non-byte-level tokens as UTF-8)."""
        b = self._bytes_cache.get(token_id)
        if b is None:
            s = self.token(token_id)
            try:
                b = bytes(_CHAR_TO_BYTE[c] for c in s)
            except KeyError:
                b = s.encode("utf-8")
            self._bytes_cache[token_id] = b
        return b


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)
