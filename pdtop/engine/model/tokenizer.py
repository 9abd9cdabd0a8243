"""The tokenizer and chat template of a GGUF file, built on the `tokenizers` library.

Two vocabulary kinds, as llama.cpp reads them:
- `tokenizer.ggml.model = gpt2`: byte-level BPE from the file's tokens and merges, with
  the pre-tokenizer named by `tokenizer.ggml.pre` (`pretokenizers.py`).
- `tokenizer.ggml.model = llama`: SentencePiece vocabularies (scores, `<0xNN>` byte
  tokens, `▁` for spaces). llama.cpp tokenizes them by repeatedly merging the adjacent
  pair whose merged piece has the highest score, then spelling leftovers as bytes; that
  is BPE whose merges are ranked by the merged piece's score, with byte fallback, which
  is what `sentencepiece_bpe` builds (as transformers' GGUF converter does).

Control tokens (`<|im_start|>`, `<s>`) are special tokens, recognised in text;
user-defined ones are added tokens. Errors are `EngineError`s: `ModelFileError` for a
bad file, `UnsupportedModelError` for a tokenizer kind not handled, `PromptError` for
bad ids or messages.
"""
from __future__ import annotations

import json
import operator
import os
import re
import secrets
from datetime import datetime
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.decoders import DecodeStream

from pdtop.engine.errors import ModelFileError, PromptError, UnsupportedModelError
from pdtop.engine.model.gguf_file import read_gguf
from pdtop.engine.model.pretokenizers import PRE_TOKENIZERS, byte_level_pre_tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]

# llama.cpp token types (tokenizer.ggml.token_type)
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space, ▁
MAX_PENDING = 16  # tokens held back by a stream decoder; no UTF-8 character needs more


class StreamDecoder:
    """Incremental detokenizer over `tokenizers.decoders.DecodeStream`: `push` returns only
    text whose UTF-8 bytes are complete.

    The concatenation of every `push` and the final `flush` equals `Tokenizer.decode` of
    the same ids. Memory stays bounded: at most `MAX_PENDING` held-back tokens, after
    which they are decoded as they are (U+FFFD for broken bytes).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._stream = DecodeStream(skip_special_tokens=skip_special)
        self._pending: list[int] = []

    def push(self, token_id: int) -> str:
        """Add one token; return the text completed by it (possibly "")."""
        i = self._tok._check_id(token_id)
        text = self._stream.step(self._tok._hf, i)
        if text is not None:
            self._pending.clear()
            return text
        self._pending.append(i)
        return self.flush() if len(self._pending) >= MAX_PENDING else ""

    def flush(self) -> str:
        """End of stream: return what is held back (an incomplete sequence becomes U+FFFD)."""
        if not self._pending:
            return ""
        text = self._tok.decode(self._pending, skip_special=self._skip)
        self._pending.clear()
        self._stream = DecodeStream(skip_special_tokens=self._skip)
        return text


class Tokenizer:
    """A GGUF's vocabulary (byte-level BPE or SentencePiece) with special tokens and its chat template."""

    def __init__(self, hf: _HFTokenizer, *, bos_id: int | None, eos_id: int, special_ids: set[int],
                 chat_template: str | None, vocab_size: int | None = None, source: str = "<memory>",
                 max_token_bytes: int | None = None):
        self._hf = hf
        self._literal_hf: _HFTokenizer | None = None  # the same, reading special-token text as text
        specials = sorted((hf.id_to_token(i) or "" for i in special_ids), key=len, reverse=True)
        self._special_text = re.compile("|".join(re.escape(t) for t in specials if t)) if any(specials) else None
        # the most UTF-8 bytes one token spans: a text of n bytes is at least n / max_token_bytes tokens
        self.max_token_bytes: int = max_token_bytes or max(
            len(t.encode()) for t in hf.get_vocab(with_added_tokens=True))
        self.vocab_size: int = max(vocab_size or 0, hf.get_vocab_size(with_added_tokens=True))
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.special_ids = set(special_ids)
        self.chat_template = chat_template
        self.source = source
        self._template: Template | None = None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        path = os.fspath(path)
        meta = read_gguf(path, tensors=False).metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelFileError(f"{path}: GGUF has no tokenizer data (tokenizer.ggml.tokens missing)")
        # llama.cpp names empty tokens so that every id keeps a distinct text
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types = meta.get("tokenizer.ggml.token_type") or [TYPE_NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise ModelFileError(f"{path}: {len(types)} token types for {len(tokens)} tokens")
        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        if eos_id is None:
            raise ModelFileError(f"{path}: GGUF has no tokenizer.ggml.eos_token_id")
        model = meta.get("tokenizer.ggml.model", "gpt2")
        if model == "gpt2":
            hf = byte_level_bpe(path, meta, tokens)
        elif model == "llama":
            hf = sentencepiece_bpe(path, meta, tokens, types)
        else:
            raise UnsupportedModelError(f"{path}: unsupported tokenizer model {model!r} "
                                        "(supported: gpt2 = byte-level BPE, llama = SentencePiece)")
        special = {i for i, t in enumerate(types) if t in (TYPE_CONTROL, TYPE_UNKNOWN)}
        # byte-level BPE stores one character per byte; a SentencePiece piece's UTF-8 is at least its bytes
        span = max(len(t) if model == "gpt2" else len(t.encode()) for t in tokens)
        hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special)])
        hf.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                       for i, t in enumerate(types) if t == TYPE_USER_DEFINED])
        return cls(hf, bos_id=meta.get("tokenizer.ggml.bos_token_id"), eos_id=int(eos_id), special_ids=special,
                   chat_template=meta.get("tokenizer.chat_template"), vocab_size=len(tokens), source=path,
                   max_token_bytes=span)

    def token(self, token_id: int) -> str:
        """The vocabulary string of one id (its stored form, e.g. 'Ġthe' or '▁the')."""
        return self._hf.id_to_token(self._check_id(token_id)) or ""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it are recognised; no BOS is added."""
        if not isinstance(text, str):
            raise PromptError(f"encode expects str, got {type(text).__name__}")
        return _ids(self._hf, text)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat-formatted `messages`. The template's own markers are control tokens;
        special-token text inside a message's content stays text, so a user cannot forge a turn
        (`<|im_start|>system` written in a message is not a system turn). Content without such
        text is tokenized exactly as `encode(apply_chat_template(messages))`."""
        contents = [m.get("content") if isinstance(m, dict) else None for m in messages]
        if self._special_text is None or not any(isinstance(c, str) and self._special_text.search(c)
                                                 for c in contents):
            return self.encode(self.apply_chat_template(messages, add_generation_prompt))
        nonce = secrets.token_hex(8)
        marked = [{**m, "content": f"\ue000{nonce}:{i}\ue001"} if isinstance(contents[i], str) else m
                  for i, m in enumerate(messages)]
        pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", self.apply_chat_template(marked, add_generation_prompt))
        if self._literal_hf is None:
            self._literal_hf = _HFTokenizer.from_str(self._hf.to_str())
            self._literal_hf.encode_special_tokens = True
        ids: list[int] = []
        for k, piece in enumerate(pieces):  # template text, a content's index, template text, ...
            if k % 2:
                ids += _ids(self._literal_hf, str(contents[int(piece)]))
            elif piece:
                ids += _ids(self._hf, piece)
        return ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self._hf.decode([self._check_id(i) for i in ids], skip_special_tokens=skip_special)

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render the file's chat template with jinja2 the way transformers does."""
        if self.chat_template is None:
            raise UnsupportedModelError(f"{self.source}: GGUF has no tokenizer.chat_template")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise PromptError("messages must be a list of dicts with a 'role' key")
        named = {name: self._hf.id_to_token(i) for name, i in
                 (("bos_token", self.bos_id), ("eos_token", self.eos_id)) if i is not None}
        try:
            if self._template is None:
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
                env.filters["tojson"] = _tojson
                env.globals["raise_exception"] = _raise_exception
                env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
                self._template = env.from_string(self.chat_template)
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **named)
        except TemplateError as e:
            raise PromptError(f"chat template: {e}"[:300]) from None

    def _check_id(self, token_id: int) -> int:
        """The id as a plain int (numpy / torch ints accepted); PromptError if it is not in the vocabulary."""
        try:
            i = operator.index(token_id)
        except TypeError:
            raise PromptError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= i < self.vocab_size:
            raise PromptError(f"token id {i} out of range [0, {self.vocab_size})")
        return i


def _ids(hf: _HFTokenizer, text: str) -> list[int]:
    """`hf`'s ids of `text`. A long text goes through `encode_batch`, which lets go of the GIL while it
    works (`encode` holds it: 640 KB of text stalled every other thread for 1.3 s). PromptError for a
    lone surrogate (JSON can spell one, `"\\ud800"`), which is not text `tokenizers` takes."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise PromptError(f"not valid Unicode text: a lone surrogate at character {exc.start}") from None
    if len(text) < 4096:
        return hf.encode(text, add_special_tokens=False).ids
    return hf.encode_batch([text], add_special_tokens=False)[0].ids


def byte_level_bpe(path: str, meta: dict[str, Any], tokens: list[str]) -> _HFTokenizer:
    """GPT-2-style BPE over byte-level tokens, split first by the named pre-tokenizer."""
    pre = meta.get("tokenizer.ggml.pre", "default")
    spec = PRE_TOKENIZERS.get(pre)
    if spec is None:
        raise UnsupportedModelError(f"{path}: pre-tokenizer {pre!r} is not supported "
                                    f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise ModelFileError(f"{path}: GGUF has no tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise ModelFileError(f"{path}: a tokenizer.ggml.merges entry is not two tokens")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False,
                     byte_fallback=False, ignore_merges=spec.ignore_merges)
    hf = _HFTokenizer(bpe)
    hf.pre_tokenizer = byte_level_pre_tokenizer(spec)
    hf.decoder = decoders.ByteLevel()
    return hf


def sentencepiece_bpe(path: str, meta: dict[str, Any], tokens: list[str], types: list[int]) -> _HFTokenizer:
    """llama.cpp's SentencePiece tokenizer as BPE: merges of every pair of normal pieces that
    forms a normal piece, ranked by that piece's score; spaces as `▁`; bytes as `<0xNN>`."""
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelFileError(f"{path}: SentencePiece vocabulary without one tokenizer.ggml.scores entry per token")
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TYPE_NORMAL}
    ranked = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            if piece[:cut] in normal and piece[cut:] in normal:
                ranked.append((-scores[i], i, piece[:cut], piece[cut:]))
    ranked.sort()
    unk = next((tokens[i] for i, t in enumerate(types) if t == TYPE_UNKNOWN), None)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[(a, b) for _, _, a, b in ranked],
                     unk_token=unk, fuse_unk=True, byte_fallback=True)
    hf = _HFTokenizer(bpe)
    # llama.cpp: a space before the text (and after each special token), unless the file says not to
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    escape = normalizers.Replace(" ", SPACE)
    hf.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if prefix else escape
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return hf


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)
