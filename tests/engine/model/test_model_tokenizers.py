"""Tokenizer breadth: byte-level BPE under llama.cpp's pre-tokenizer names, and SentencePiece
(`tokenizer.ggml.model = llama`) vocabularies, from tiny vocabularies trained here and
written to GGUF metadata.

Oracles: the SentencePiece vocabulary is checked against a transcription of llama.cpp's
SPM algorithm (highest-scoring adjacent pair first, leftovers as `<0xNN>` bytes); the
pre-tokenizers against llama.cpp's regex lists run with the `regex` module (where it is
installed) and against hand-worked splits.
"""
from __future__ import annotations

import heapq
import json

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tokenizers.implementations import SentencePieceBPETokenizer

from pdtop.engine.errors import ModelFileError, PromptError, UnsupportedModelError
from pdtop.engine.model.pretokenizers import PRE_TOKENIZERS
from pdtop.engine.model.tokenizer import Tokenizer

CORPUS = ["The quick brown fox jumps over the lazy dog. It's 2024; we're testing tokenizers!",
          "Les élèves étudient à l'école. Über naïve café, 東京 and 北京.",
          "def main():\n    return 42  # the answer\n", "Hello world, hello World, HELLO WORLD... don't",
          "I'LL say I'll, YOU'RE right: you're 100% right; 3.14159 > 3"] * 20
TEXTS = ["Hello world", "  two  spaces and\ttabs\n\nnew lines ", "It's 12345 o'clock; I'M HERE, we'LL see",
         "naïve café 東京 🙂🎉 unseen ß∂ƒ", "x=1+2  # comment\r\n", "helloWorld HTTPServer iPhone", "", " ", "\n"]
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_vocab(path, model: str, tokens: list[str], types: list[int], **meta) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_eos_token_id(types.index(3))
    for key, value in meta.items():
        if key == "scores":
            w.add_token_scores(value)
        elif key == "merges":
            w.add_token_merges(value)
        elif key == "pre":
            w.add_tokenizer_pre(value)
        elif key == "add_space_prefix":
            w.add_add_space_prefix(value)
        elif key == "chat_template":
            w.add_chat_template(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------- byte-level BPE

@pytest.fixture(scope="module")
def byte_level_vocab():
    """A byte-level BPE trained on CORPUS: (tokens, types, merges), with control and user-defined tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(tok.to_str())["model"]
    tokens = CONTROL + USER_DEFINED + sorted(model["vocab"], key=model["vocab"].get)
    tokens.append("ĠZqxj")  # in the vocabulary, but no merge leads to it
    types = [3] * len(CONTROL) + [4] * len(USER_DEFINED) + [1] * (len(tokens) - len(CONTROL) - len(USER_DEFINED))
    merges = [" ".join(m) for m in model["merges"]]
    return tokens, types, merges


def byte_level_tokenizer(tmp_path, vocab, pre: str | None) -> Tokenizer:
    tokens, types, merges = vocab
    path = tmp_path / f"bpe-{pre}.gguf"
    meta = {"merges": merges, "chat_template": TEMPLATE}
    if pre is not None:
        meta["pre"] = pre
    write_vocab(path, "gpt2", tokens, types, **meta)
    return Tokenizer.from_gguf(path)


@pytest.mark.parametrize("pre", [*sorted({spec: name for name, spec in PRE_TOKENIZERS.items()}.values()), None])
def test_byte_level_round_trip_under_every_pre_tokenizer(tmp_path, byte_level_vocab, pre):
    tok = byte_level_tokenizer(tmp_path, byte_level_vocab, pre)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        sd = tok.stream_decoder()
        assert "".join(sd.push(i) for i in ids) + sd.flush() == text
    ids = tok.encode("<|im_start|>user\nhi <tool> there<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and 3 in ids  # control and user-defined tokens are single tokens
    assert tok.decode(ids, skip_special=True) == "user\nhi <tool> there"


def test_llama_bpe_matches_whole_pieces_before_merging(tmp_path, byte_level_vocab):
    """llama.cpp's `ignore_merges` for Llama 3: a piece that is a token is that token."""
    zq = byte_level_vocab[0].index("ĠZqxj")
    assert byte_level_tokenizer(tmp_path, byte_level_vocab, "llama-bpe").encode(" Zqxj") == [zq]
    assert zq not in byte_level_tokenizer(tmp_path, byte_level_vocab, "gpt-2").encode(" Zqxj")


def pieces(tok: Tokenizer, text: str) -> list[str]:
    return [decoders.ByteLevel().decode([p]) for p, _ in tok._hf.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("pre, text, want", [
    ("llama-bpe", "It's 12345 apples", ["It", "'s", " ", "123", "45", " apples"]),
    ("llama-bpe", "I'M here!!\n\nok", ["I", "'M", " here", "!!\n\n", "ok"]),
    ("qwen2", "It'S 12345", ["It", "'S", " ", "1", "2", "3", "4", "5"]),
    ("gpt-2", "I'M 12345  x", ["I", "'", "M", " 12345", " ", " x"]),
    ("smollm", "v 2024", ["v", " ", "2", "0", "2", "4"]),
    ("falcon", "ab 12345!?", ["ab", " ", "123", "45", "!?"]),
    ("tekken", "helloWorld HTTPServer", ["hello", "World", " HTTPServer"]),
])
def test_pre_tokenizer_splits(tmp_path, byte_level_vocab, pre, text, want):
    assert pieces(byte_level_tokenizer(tmp_path, byte_level_vocab, pre), text) == want


# llama.cpp's regex lists (its own rewrites: no inline flags), applied as llama.cpp does:
# each regex splits every piece into matches and the text between them.
LLAMA_CPP_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA_CPP_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_CPP_REGEXES = {
    "gpt-2": [LLAMA_CPP_GPT2],
    "llama-bpe": [LLAMA_CPP_LLAMA3],
    "qwen2": [LLAMA_CPP_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")],
    "smollm": [r"\p{N}", LLAMA_CPP_GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", LLAMA_CPP_GPT2, "[0-9][0-9][0-9]"],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", LLAMA_CPP_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
}


def llama_cpp_split(text: str, regexes: list[str]) -> list[str]:
    regex = pytest.importorskip("regex")
    parts = [text] if text else []
    for r in regexes:
        out = []
        for part in parts:
            pos = 0
            for m in regex.finditer(r, part):
                if m.start() > pos:
                    out.append(part[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(part):
                out.append(part[pos:])
        parts = out
    return parts


@pytest.mark.parametrize("pre", sorted(LLAMA_CPP_REGEXES))
def test_pre_tokenizers_split_as_llama_cpp(tmp_path, byte_level_vocab, pre):
    tok = byte_level_tokenizer(tmp_path, byte_level_vocab, pre)
    for text in TEXTS + CORPUS[:5] + ["$100 + <b>x</b> ^~| `code` 1,234,567.89", "don'T WON'T we've  \r\n\r\n x"]:
        assert pieces(tok, text) == llama_cpp_split(text, LLAMA_CPP_REGEXES[pre]), text


def test_unknown_pre_tokenizer_refused_by_name(tmp_path, byte_level_vocab):
    with pytest.raises(UnsupportedModelError, match=r"pre-tokenizer 'deepseek-llm' is not supported \(supported: "):
        byte_level_tokenizer(tmp_path, byte_level_vocab, "deepseek-llm")


# ---------------------------------------------------------------- SentencePiece

@pytest.fixture(scope="module")
def spm_vocab():
    """A Llama-style SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces by
    descending score (merge order), then single characters. Like Llama's, it has no piece with a
    newline (that is byte <0x0A>), and every character of a piece is a piece."""
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(CORPUS, vocab_size=400, show_progress=False)
    model = json.loads(sp.to_str())["model"]
    merged = ["".join(m) for m in model["merges"] if "\n" not in "".join(m)]
    chars = [t for t in model["vocab"] if len(t) == 1 and t not in ("\n", "<unk>")]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, piece in enumerate(dict.fromkeys(merged)):
        tokens.append(piece), types.append(1), scores.append(-float(i))
    for c in chars:
        tokens.append(c), types.append(1), scores.append(-1e6)
    return tokens, types, scores


def spm_tokenizer(tmp_path, vocab, **meta) -> Tokenizer:
    tokens, types, scores = vocab
    path = tmp_path / "spm.gguf"
    write_vocab(path, "llama", tokens, types, scores=scores, chat_template=TEMPLATE, **meta)
    return Tokenizer.from_gguf(path)


def llama_cpp_spm(text: str, tokens: list[str], scores: list[float]) -> list[int]:
    """llama.cpp's `llm_tokenizer_spm_session.tokenize` on already-escaped text (spaces as ▁)."""
    ids = {t: i for i, t in enumerate(tokens)}
    sym = [[c, i - 1, i + 1] for i, c in enumerate(text)]  # text, prev, next
    if sym:
        sym[-1][2] = -1
    queue: list = []
    merged_from: dict[str, tuple[int, int]] = {}

    def add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        piece = sym[left][0] + sym[right][0]
        if piece in ids:
            heapq.heappush(queue, (-scores[ids[piece]], left, right, len(piece)))
            merged_from[piece] = (left, right)

    for i in range(1, len(sym)):
        add(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not sym[left][0] or not sym[right][0] or len(sym[left][0]) + len(sym[right][0]) != size:
            continue
        sym[left][0] += sym[right][0]
        sym[right][0] = ""
        sym[left][2] = sym[right][2]
        if sym[right][2] >= 0:
            sym[sym[right][2]][1] = left
        add(sym[left][1], left)
        add(left, sym[left][2])
    out: list[int] = []
    i = 0 if sym else -1
    while i != -1:
        piece = sym[i][0]
        out += [ids[piece]] if piece in ids else [ids[f"<0x{b:02X}>"] for b in piece.encode()]
        i = sym[i][2]
    return out


def escaped(text: str, prefix: bool = True) -> str:
    return (" " + text if prefix and text else text).replace(" ", "▁")


def test_sentencepiece_matches_llama_cpp(tmp_path, spm_vocab):
    tok = spm_tokenizer(tmp_path, spm_vocab)
    tokens, _, scores = spm_vocab
    for text in TEXTS + CORPUS[:5]:
        want = llama_cpp_spm(escaped(text), tokens, scores)
        assert tok.encode(text) == want, text
        assert tok.decode(want) == text
        sd = tok.stream_decoder()
        assert "".join(sd.push(i) for i in want) + sd.flush() == text
    assert "<0x0A>" in map(tok.token, tok.encode("a\nb"))  # no newline piece: byte fallback


def test_sentencepiece_specials_and_space_prefix(tmp_path, spm_vocab):
    tokens, _, scores = spm_vocab
    tok = spm_tokenizer(tmp_path, spm_vocab)
    # llama.cpp puts a space before the text after each special token too
    assert tok.encode("<s>Hello world</s>") == [1, *llama_cpp_spm(escaped("Hello world"), tokens, scores), 2]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n"
    no_prefix = spm_tokenizer(tmp_path, spm_vocab, add_space_prefix=False)
    assert no_prefix.encode("Hello world") == llama_cpp_spm(escaped("Hello world", prefix=False), tokens, scores)
    assert no_prefix.decode(no_prefix.encode(" Hello")) == " Hello"


def test_sentencepiece_stream_holds_back_byte_fallback(tmp_path, spm_vocab):
    tok = spm_tokenizer(tmp_path, spm_vocab)
    ids = tok.encode("go 🎉 now")
    assert sum(t.startswith("<0x") for t in map(tok.token, ids)) == 4  # the emoji is four byte tokens
    sd = tok.stream_decoder()
    chunks = [sd.push(i) for i in ids] + [sd.flush()]
    assert not any("\ufffd" in c for c in chunks) and any("🎉" in c for c in chunks)
    assert "".join(chunks) == "go 🎉 now"


# ---------------------------------------------------------------- refusals and errors

def test_unsupported_tokenizer_model_and_missing_data(tmp_path, spm_vocab):
    tokens, types, _ = spm_vocab
    write_vocab(tmp_path / "bert.gguf", "bert", tokens, types)
    with pytest.raises(UnsupportedModelError, match=r"bert\.gguf: unsupported tokenizer model 'bert' \(supported: "):
        Tokenizer.from_gguf(tmp_path / "bert.gguf")
    write_vocab(tmp_path / "noscores.gguf", "llama", tokens, types)
    with pytest.raises(ModelFileError, match=r"tokenizer\.ggml\.scores"):
        Tokenizer.from_gguf(tmp_path / "noscores.gguf")
    write_vocab(tmp_path / "nomerges.gguf", "gpt2", tokens, types, pre="gpt-2")
    with pytest.raises(ModelFileError, match=r"no tokenizer\.ggml\.merges"):
        Tokenizer.from_gguf(tmp_path / "nomerges.gguf")


def test_chat_template_errors_are_prompt_errors(tmp_path, spm_vocab):
    tok = spm_tokenizer(tmp_path, spm_vocab)
    tok.chat_template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    tok._template = None
    with pytest.raises(PromptError, match="chat template: system first"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_stream_decoder_memory_is_bounded(tmp_path, spm_vocab):
    """A flood of bytes that never completes a character is let out as U+FFFD, not hoarded."""
    tok = spm_tokenizer(tmp_path, spm_vocab)
    lone = spm_vocab[0].index("<0x80>")  # a UTF-8 continuation byte
    sd = tok.stream_decoder()
    out = "".join(sd.push(lone) for _ in range(1000)) + sd.flush()
    assert out == tok.decode([lone] * 1000) and set(out) == {"\ufffd"}
