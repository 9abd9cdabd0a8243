"""llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) -> `tokenizers` pre-tokenizers.

A GGUF does not store its pre-tokenizer, only a name that llama.cpp maps to a list of
regexes. Each regex in turn splits every piece into its matches and the text between
them (`Split(..., "isolated")`); the pieces are then mapped to GPT-2's byte alphabet
(`ByteLevel` without its own regex). Where llama.cpp rewrote a model's regex for its
own regex engine (no `(?i:...)`), the original from the model's `tokenizer.json` is
used here: the `tokenizers` library runs it as is.

Names whose regexes are not written here (deepseek-llm, deepseek-coder, bloom, poro,
chameleon, kimi-k2, ...) are refused by name rather than tokenized differently.
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

# GPT-2's regex, which `ByteLevel(use_regex=True)` also runs
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3's: contractions in any case, a letter run with one leading non-letter, digits in threes
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: Llama 3's with single digits
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# Mistral's tekken: a letter run splits before an upper-case letter that follows lower case
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DIGIT = r"\p{N}"
THREE_DIGITS = r"[0-9][0-9][0-9]"


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a whole piece that is in the vocabulary is one token (Llama 3's BPE)


_SPECS: dict[tuple[str, ...], PreTokenizerSpec] = {
    # the regexes llama.cpp uses when a file names none
    ("default",): PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", THREE_DIGITS)),
    ("gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat",
     "a.x-4.0", "mellum", "trillion", "granite-docling", "exaone4"): PreTokenizerSpec((GPT2,)),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        PreTokenizerSpec((LLAMA3,), ignore_merges=True),
    ("dbrx", "smaug-bpe", "chatglm-bpe", "glm4"): PreTokenizerSpec((LLAMA3,)),
    ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"): PreTokenizerSpec((QWEN2,)),
    ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"):
        PreTokenizerSpec((DIGIT, GPT2)),
    ("falcon",): PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, THREE_DIGITS)),
    ("tekken",): PreTokenizerSpec((TEKKEN,), ignore_merges=True),
}
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {name: spec for names, spec in _SPECS.items() for name in names}


def byte_level_pre_tokenizer(spec: PreTokenizerSpec) -> pre_tokenizers.PreTokenizer:
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
