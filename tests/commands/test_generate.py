"""`pdtop generate` as a user runs it: a subprocess, stdout for the completion, stderr for the rest."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


def generate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdtop", "generate", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_chat_reference_answer_and_timing_line():
    """float32's reference answer (the default on the CPU, gguf, flips at its near tie: test_quant_kernels)."""
    p = generate("--chat", "--dtype", "float32", "What is the capital of France?")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "The capital of France is Paris.\n"
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("prefill 37 tokens in ") and " tok/s; finish: eos;" in lines[0]
    assert lines[0].endswith("SmolLM2-135M-Instruct float32 on cpu")


def test_seeded_sampling_is_reproducible_and_stops_at_max_tokens(tokenizer):
    args = ("--max-tokens", "12", "--temperature", "0.9", "--top-p", "0.9", "--seed", "7", "Once upon a time")
    a, b = generate(*args), generate(*args)
    assert a.returncode == b.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "decode 11 tokens" in a.stderr and "finish: length" in a.stderr
    assert len(tokenizer.encode(a.stdout.rstrip("\n"))) in range(10, 15)  # re-tokenizing may merge a little


@pytest.mark.parametrize("args,message", [
    (["   "], "empty prompt"),
    (["--max-tokens", "0", "hi"], "--max-tokens must be >= 1"),
    (["--top-p", "1.5", "hi"], "--top-p must be in (0, 1]"),
    (["--model", "/nonexistent/model.gguf", "hi"], "/nonexistent/model.gguf: model file not found"),
    (["--model", __file__, "hi"], "test_generate.py: not a GGUF file"),
    (["--model", "synthetic:nope", "hi"], "unknown synthetic model"),
    (["--chat", "--max-tokens", "8180", "What is the capital of France?"],
     "prompt of 37 tokens + max_tokens 8180 exceeds the model's context of 8192 tokens"),
    (["--chat", "--kv-tokens", "32", "What is the capital of France?"],
     "KV cache too small: request 0 (37-token prompt + max_tokens 128) needs 165 tokens, the whole cache holds 32"),
    (["--device", "sim:H100", "hi"], "a simulated GPU runs no model"),
    (["--device", "cuda:x", "hi"], "the GPU index must be a number"),
    (["--device", "tpu", "hi"], "unknown device 'tpu'"),
    (["--model", "synthetic:smollm2-135m", "--dtype", "gguf", "hi"], "unsupported dtype 'gguf'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    p = generate(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdtop generate: error: ") and message in lines[0], p.stderr


def test_synthetic_model_prints_token_ids():
    p = generate("--model", "synthetic:smollm2-135m", "--layers", "2", "--max-tokens", "4", "hello")
    assert p.returncode == 0, p.stderr
    ids = p.stdout.split()
    assert len(ids) <= 4 and all(0 <= int(i) < 49152 for i in ids)
    assert "synthetic:smollm2-135m float32 on cpu" in p.stderr


def test_help_explains():
    p = subprocess.run([sys.executable, "-m", "pdtop", "generate", "--help"], capture_output=True, text=True)
    assert p.returncode == 0
    for flag in ("--chat", "--max-tokens", "--dtype", "--model", "--temperature", "--top-p", "--seed"):
        assert flag in p.stdout


def test_the_cpu_default_computes_on_the_files_blocks():
    """No --dtype on the CPU and a Q4_1 file: gguf, and the timing line says which kernels ran."""
    from pdtop.engine.model import quant_kernels

    if quant_kernels.kernels() is None:
        pytest.skip("no C compiler / OpenMP runtime for the quantized kernels here")
    p = generate("--max-tokens", "6", "Once upon a time")
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert p.stdout.strip() and len(lines) == 1, p.stderr
    assert lines[0].endswith(("SmolLM2-135M-Instruct gguf Q4_1+Q8_0 (avx2) on cpu",
                              "SmolLM2-135M-Instruct gguf Q4_1+Q8_0 (avx512-vnni) on cpu",
                              "SmolLM2-135M-Instruct gguf Q4_1+Q8_0 (portable) on cpu")), lines


def test_without_the_kernels_the_default_is_float32_with_one_line():
    env = {**os.environ, "PDTOP_NO_KERNELS": "1"}
    p = subprocess.run([sys.executable, "-m", "pdtop", "generate", "--max-tokens", "3", "Once upon a time"],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr
    why, timing = p.stderr.strip().splitlines()
    assert why == "PDTOP_NO_KERNELS is set: loading float32, not the file's quantized blocks"
    assert timing.endswith("SmolLM2-135M-Instruct float32 on cpu"), timing
