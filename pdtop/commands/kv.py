"""Print a model's KV cache: bytes a token, a request's KV at given contexts, and how many
requests of each context fit in a memory size.

A token needs 2 (K and V) x layers x KV heads x head_dim x bytes an element, in every
layer; a request of S tokens S times that. The model's shape comes from a GGUF file's
metadata (no weights are read), a synthetic: name, or --layers/--kv-heads/--head-dim.
The KV cache's element type is --dtype, whatever the weights are stored in: fp8 is vLLM's
and SGLang's --kv-cache-dtype fp8 (one byte an element; their per-tensor scales are a few
floats a layer, not counted). Examples:
  pdtop kv --layers 64 --kv-heads 8 --head-dim 128 --memory-gib 80   (Qwen2.5-32B, GQA)
  pdtop kv --model synthetic:llama3.1-8b --context 8192,131072 --json
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

from pdtop.commands.common import INPUT_ERRORS, fail, number_list, positive_int
from pdtop.engine.roofline.kv import (
    DTYPE_BYTES,
    DTYPE_HELP,
    kv_bytes,
    kv_bytes_per_token,
    parse_dtype_bytes,
    requests_fit,
)

GIB = 1024**3
SHAPE_FLAGS = ("--layers", "--kv-heads", "--head-dim")
UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", metavar="PATH|synthetic:NAME",
                        help="a GGUF file (its metadata only) or synthetic:NAME (qwen3-8b, llama3.1-8b, "
                             "smollm2-135m); default: the shipped SmolLM2-135M GGUF, unless the shape flags are given")
    parser.add_argument("--layers", metavar="L", help="the shape without a model: decoder layers")
    parser.add_argument("--kv-heads", metavar="H", help="the shape without a model: KV heads (GQA/MQA share them)")
    parser.add_argument("--head-dim", metavar="D", help="the shape without a model: dimensions of a head")
    parser.add_argument("--dtype", default="bfloat16",
                        help=f"the KV cache's element type: {DTYPE_HELP} (default: bfloat16)")
    parser.add_argument("--context", default="8192,32768",
                        help="tokens of a request, comma-separated (default: 8192,32768)")
    parser.add_argument("--memory-gib", metavar="GIB",
                        help="memory for the KV cache, in GiB: how many requests of each context fit")
    parser.add_argument("--json", action="store_true",
                        help='print {"bytes_per_token", "contexts": [{"context", "bytes", "requests_fit"}]} '
                             "(requests_fit null without --memory-gib)")


def _shape(args: argparse.Namespace) -> tuple[str | None, int, int, int, int | None]:
    """(model name or None, layers, KV heads, head_dim, query heads or None) from the flags or the model."""
    given = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in SHAPE_FLAGS}
    named = [flag for flag, value in given.items() if value is not None]
    if named and args.model is not None:
        raise ValueError(f"--model cannot be mixed with {', '.join(named)}: give a model, "
                         "or a shape (--layers, --kv-heads, --head-dim)")
    if named:
        missing = [flag for flag in SHAPE_FLAGS if flag not in named]
        if missing:
            raise ValueError(f"the shape needs --layers, --kv-heads and --head-dim; missing {', '.join(missing)}")
        layers, heads, dim = (positive_int(flag, given[flag]) for flag in SHAPE_FLAGS)
        return None, layers, heads, dim, None
    if args.model is not None and args.model.startswith("synthetic:"):
        from pdtop.engine.model.config import synthetic_config

        cfg = synthetic_config(args.model)
    else:
        from pdtop.engine.model.loader import default_model_path, read_config  # the GGUF's metadata, no weights

        cfg = read_config(default_model_path() if args.model is None else args.model)
    return cfg.name, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.num_heads


def _memory(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        gib = float(text)
    except ValueError:
        gib = math.nan
    if not (gib > 0 and math.isfinite(gib)):
        raise ValueError(f"--memory-gib: expected a number of GiB > 0, got {text!r}")
    return gib


def size(nbytes: int) -> str:
    """`nbytes` in the largest binary unit that keeps it >= 1, to 3 significant digits or so:
    262144 -> '256 KiB', 2**31 -> '2 GiB', 1310720 -> '1.25 MiB'."""
    if nbytes < 1024:
        return f"{nbytes:,} bytes"
    value, unit = nbytes / 1024, UNITS[0]
    for bigger in UNITS[1:]:
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    text = f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {unit}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _fit(n: int, gib: float) -> str:
    where = f"in {gib:g} GiB"
    return f"none fit {where}" if n == 0 else f"1 fits {where}" if n == 1 else f"{n:,} fit {where}"


def report(name: str | None, layers: int, kv_heads: int, head_dim: int, heads: int | None, dtype: str,
           dtype_bytes: int, contexts: list[int], gib: float | None) -> tuple[dict[str, Any], list[str]]:
    """The JSON object and the text lines of `pdtop kv`."""
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)
    memory = None if gib is None else int(gib * GIB)
    rows: list[dict[str, Any]] = []
    for context in contexts:
        nbytes = kv_bytes(layers, kv_heads, head_dim, context, 1, dtype_bytes)
        rows.append({"context": context, "bytes": nbytes,
                     "requests_fit": None if memory is None else requests_fit(memory, nbytes)})
    data = {"bytes_per_token": per_token, "contexts": rows}

    shape = f"{layers} layers x {kv_heads} KV heads x head_dim {head_dim}"
    element = f"{dtype.strip().lower()} ({_plural(dtype_bytes, 'byte')})" if dtype.strip().lower() in DTYPE_BYTES \
        else f"{_plural(dtype_bytes, 'byte')} an element"
    per = f"{per_token:,} bytes" + (f" ({size(per_token)})" if per_token >= 1024 else "")
    lines = [f"KV cache of {f'{name} ({shape})' if name else shape}, {element}:",
             f"  a token needs {per}: 2 (K and V) x {layers} layers x {kv_heads} KV heads x {head_dim} head_dim"
             f" x {_plural(dtype_bytes, 'byte')}"]
    if heads is not None and heads > kv_heads:
        lines.append(f"  (with MHA's {heads} KV heads, one per query head, it would need {heads / kv_heads:g}x that: "
                     f"{kv_bytes_per_token(layers, heads, head_dim, dtype_bytes):,} bytes)")
    width = max(len(f"{c:,}") for c in contexts)
    for row in rows:
        tokens = f"{row['context']:>{width},} token" + ("" if row["context"] == 1 else "s")
        line = f"  a request of {tokens} needs {size(row['bytes'])} ({row['bytes']:,} bytes)"
        if gib is not None:
            line += f"; {_fit(row['requests_fit'], gib)}"
        lines.append(line)
    return data, lines


def run(args: argparse.Namespace) -> int:
    try:
        dtype_bytes = parse_dtype_bytes(args.dtype, "--dtype")
        contexts = number_list("--context", args.context, int)
        gib = _memory(args.memory_gib)
        name, layers, kv_heads, head_dim, heads = _shape(args)
    except ValueError as exc:  # this command's own argument parsing
        return fail("kv", exc)
    except INPUT_ERRORS as exc:  # a missing or unreadable model file, an unknown synthetic name
        return fail("kv", exc)
    data, lines = report(name, layers, kv_heads, head_dim, heads, args.dtype, dtype_bytes, contexts, gib)
    print(json.dumps(data) if args.json else "\n".join(lines))
    return 0
