"""`pdtop kv`: the seed's KV-cache example from shape flags and from a GGUF's metadata, and bad input."""
from __future__ import annotations

import json

import pytest

from pdtop.cli import main
from pdtop.engine.model.config import synthetic_config

GIB = 1024**3
QWEN25_32B = ["--layers", "64", "--kv-heads", "8", "--head-dim", "128"]


def kv(capsys, *args: str) -> str:
    assert main(["kv", *args]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


@pytest.fixture
def qwen25_32b_gguf(tmp_path):
    """A GGUF with Qwen2.5-32B's metadata (64 layers, 40 heads of 128, 8 KV heads) and no tensors at all."""
    import gguf

    path = tmp_path / "Qwen2.5-32B-Instruct-shapes.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(64)
    w.add_embedding_length(5120)
    w.add_head_count(40)
    w.add_head_count_kv(8)
    w.add_feed_forward_length(27648)
    w.add_vocab_size(152064)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_the_seeds_example(capsys):
    assert kv(capsys, *QWEN25_32B, "--memory-gib", "80").splitlines() == [
        "KV cache of 64 layers x 8 KV heads x head_dim 128, bfloat16 (2 bytes):",
        "  a token needs 262,144 bytes (256 KiB): 2 (K and V) x 64 layers x 8 KV heads x 128 head_dim x 2 bytes",
        "  a request of  8,192 tokens needs 2 GiB (2,147,483,648 bytes); 40 fit in 80 GiB",
        "  a request of 32,768 tokens needs 8 GiB (8,589,934,592 bytes); 10 fit in 80 GiB",
    ]
    assert json.loads(kv(capsys, *QWEN25_32B, "--memory-gib", "80", "--json")) == {
        "bytes_per_token": 262_144,
        "contexts": [{"context": 8192, "bytes": 2 * GIB, "requests_fit": 40},
                     {"context": 32768, "bytes": 8 * GIB, "requests_fit": 10}]}


def test_mha_needs_five_times_as_much(capsys):
    data = json.loads(kv(capsys, "--layers", "64", "--kv-heads", "40", "--head-dim", "128", "--json"))
    assert data["bytes_per_token"] == 5 * 262_144
    assert [c["bytes"] for c in data["contexts"]] == [10 * GIB, 40 * GIB]
    assert [c["requests_fit"] for c in data["contexts"]] == [None, None]
    text = kv(capsys, "--layers", "64", "--kv-heads", "40", "--head-dim", "128", "--context", "8192")
    assert "1,310,720 bytes (1.25 MiB)" in text and "8,192 tokens needs 10 GiB" in text and "fit" not in text


def test_a_gguf_gives_the_same_numbers_from_its_metadata(capsys, qwen25_32b_gguf):
    text = kv(capsys, "--model", str(qwen25_32b_gguf), "--memory-gib", "80")
    lines = text.splitlines()
    assert lines[0] == ("KV cache of Qwen2.5-32B-Instruct-shapes (64 layers x 8 KV heads x head_dim 128), "
                        "bfloat16 (2 bytes):")
    assert lines[2] == "  (with MHA's 40 KV heads, one per query head, it would need 5x that: 1,310,720 bytes)"
    assert lines[1:2] + lines[3:] == kv(capsys, *QWEN25_32B, "--memory-gib", "80").splitlines()[1:]


def test_the_default_model_is_read_without_its_weights(capsys, monkeypatch):
    import pdtop.engine.model.gguf_file as gguf_file
    import pdtop.engine.model.loader as loader

    def refuse(*args, **kwargs):
        raise AssertionError("pdtop kv read tensor data")

    monkeypatch.setattr(loader, "load_gguf", refuse)
    monkeypatch.setattr(gguf_file.GGUFFile, "raw", refuse)
    data = json.loads(kv(capsys, "--json", "--context", "8192"))
    assert data == {"bytes_per_token": 2 * 30 * 3 * 64 * 2,  # SmolLM2-135M: 30 layers, 3 KV heads of 64
                    "contexts": [{"context": 8192, "bytes": 8192 * 23_040, "requests_fit": None}]}
    assert kv(capsys).startswith("KV cache of SmolLM2-135M-Instruct (30 layers x 3 KV heads x head_dim 64)")


@pytest.mark.parametrize("name", ["qwen3-8b", "llama3.1-8b", "smollm2-135m"])
@pytest.mark.parametrize("dtype,nbytes", [("bfloat16", 2), ("float32", 4), ("float16", 2), ("fp8", 1),
                                          ("fp8_e5m2", 1), ("1", 1), ("2", 2)])
def test_synthetic_models_and_dtypes(capsys, name, dtype, nbytes):
    cfg = synthetic_config(name)
    data = json.loads(kv(capsys, "--model", f"synthetic:{name}", "--dtype", dtype, "--context", "1,4096",
                         "--memory-gib", "0.5", "--json"))
    per_token = cfg.kv_bytes_per_token(nbytes)
    assert data["bytes_per_token"] == per_token
    assert data["contexts"] == [{"context": n, "bytes": n * per_token, "requests_fit": GIB // 2 // (n * per_token)}
                                for n in (1, 4096)]


def test_fp8_is_a_byte_an_element_as_vllm_and_sglang_store_it(capsys):
    """Issue 42 item 19: `--dtype fp8` (vLLM's and SGLang's --kv-cache-dtype) was refused."""
    lines = kv(capsys, *QWEN25_32B, "--dtype", "fp8", "--context", "8192", "--memory-gib", "80").splitlines()
    assert lines[0] == "KV cache of 64 layers x 8 KV heads x head_dim 128, fp8 (1 byte):"
    assert lines[2] == "  a request of 8,192 tokens needs 1 GiB (1,073,741,824 bytes); 80 fit in 80 GiB"


def test_text_words(capsys):
    text = kv(capsys, *QWEN25_32B, "--dtype", "1", "--context", "1,100000", "--memory-gib", "0.0002")
    assert "1 byte an element" in text and "x 1 byte\n" in text
    assert "a request of       1 token needs 128 KiB (131,072 bytes); 1 fits in 0.0002 GiB" in text
    assert "a request of 100,000 tokens needs 12.2 GiB (13,107,200,000 bytes); none fit in 0.0002 GiB" in text


@pytest.mark.parametrize("args,words", [
    (["--layers", "0", "--kv-heads", "8", "--head-dim", "128"], "--layers"),
    (["--layers", "64", "--kv-heads", "-8", "--head-dim", "128"], "--kv-heads"),
    (["--layers", "64", "--kv-heads", "8", "--head-dim", "12.5"], "--head-dim"),
    (["--layers", "64", "--kv-heads", "8"], "missing --head-dim"),
    ([*QWEN25_32B, "--dtype", "fp4"], "unknown dtype 'fp4'; known: bfloat16 (bf16), float16 (fp16), float32, fp8"),
    ([*QWEN25_32B, "--dtype", "0"], "--dtype"),
    ([*QWEN25_32B, "--context", "8192,32k"], "--context"),
    ([*QWEN25_32B, "--context", "0"], "--context"),
    ([*QWEN25_32B, "--memory-gib", "-80"], "--memory-gib"),
    ([*QWEN25_32B, "--memory-gib", "lots"], "--memory-gib"),
    (["--model", "/no/such/model.gguf"], "model file not found"),
    (["--model", "synthetic:gpt-9"], "gpt-9"),
    (["--model", "synthetic:qwen3-8b", "--kv-heads", "8"], "--model cannot be mixed with --kv-heads"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    assert main(["kv", *args]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1 and lines[0].startswith("pdtop kv: error: ") and words in lines[0]


def test_a_file_that_is_not_a_model(capsys, tmp_path, mamba_gguf):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    for path, words in ((notes, "not a GGUF file"), (mamba_gguf, "unsupported architecture 'mamba'")):
        assert main(["kv", "--model", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0]
