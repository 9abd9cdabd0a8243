"""The local tokenizer `bench --url --tokenizer` names: a GGUF file, or a Hugging Face tokenizer folder as
vLLM's `--tokenizer` takes one, read without downloading anything.

A folder is `tokenizer.json` (`tokenizers.Tokenizer.from_file`) with, when there, `tokenizer_config.json`
(its `chat_template`, `bos_token` and `eos_token`, as transformers reads them) or `chat_template.jinja`.
Either becomes pdtop's `Tokenizer`, so the chat template renders as the engine renders it. Its
`eos_token` only fills a chat template's `{{ eos_token }}` here; a folder that names none gets its
first special token.
"""
from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from pdtop.engine.model.tokenizer import Tokenizer

MAX_CONFIG_BYTES = 16 << 20  # tokenizer_config.json; real ones are kilobytes (a chat template or two)


def load_tokenizer(path: str) -> Tokenizer:
    """The GGUF's or the folder's tokenizer; ValueError (one line) when `path` is neither."""
    if os.path.isdir(path):
        return from_folder(path)
    if os.path.isfile(path):
        return Tokenizer.from_gguf(path)
    raise ValueError(f"{path}: no such file or folder (--tokenizer takes a GGUF or a Hugging Face tokenizer "
                     "folder on this machine; pdtop downloads nothing)")


def _config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: over {MAX_CONFIG_BYTES} bytes")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: not JSON") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    return config


def _token_text(value: object) -> str | None:
    """A config's token: a string, or an AddedToken's {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: str, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str):
        return template
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path) and os.path.getsize(path) <= MAX_CONFIG_BYTES:
        with open(path, encoding="utf-8") as f:
            return f.read()
    return None


def from_folder(folder: str) -> Tokenizer:
    """pdtop's Tokenizer of a Hugging Face tokenizer folder."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(f"{folder}: no tokenizer.json (a Hugging Face tokenizer folder has one)")
    try:
        hf = HFTokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises plain Exception for a file it cannot read
        raise ValueError(f"{path}: not a tokenizer ({str(exc).splitlines()[0][:200] if str(exc) else exc!r})") \
            from None
    try:
        config = _config(folder)
        template = _chat_template(folder, config)
    except UnicodeDecodeError:
        raise ValueError(f"{folder}: its tokenizer config is not UTF-8 text") from None
    special = {i for i, token in hf.get_added_tokens_decoder().items() if token.special}
    ids = {name: hf.token_to_id(text) if (text := _token_text(config.get(name))) else None
           for name in ("bos_token", "eos_token")}
    eos = ids["eos_token"] if ids["eos_token"] is not None else min(special, default=0)
    return Tokenizer(hf, bos_id=ids["bos_token"], eos_id=eos, special_ids=special, chat_template=template,
                     source=folder)
