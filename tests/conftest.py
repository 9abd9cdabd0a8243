"""Shared fixtures: the real SmolLM2-135M GGUF, loaded once per test session.

`gguf_path`, `model_fp32` and `tokenizer` are session-scoped; `runner` is a
factory that builds a fresh `ModelRunner` (its own KV cache) around the shared
model: `runner()` or `runner(kv_capacity_tokens=256, block_size=16)`. `live` is that model served by the
real engine and API on loopback, shared by the API tests and the bench tests that drive it.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pdtop.engine.runtime.runner import ModelRunner


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from pdtop.engine.model.loader import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def model_fp32(gguf_path):
    from pdtop.engine.model.loader import load_model

    return load_model(gguf_path, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tokenizer(gguf_path):
    from pdtop.engine.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_path)


@pytest.fixture
def runner(model_fp32) -> Callable[..., ModelRunner]:
    from pdtop.engine.runtime.runner import ModelRunner

    def make(kv_capacity_tokens: int = 4096, block_size: int = 16) -> ModelRunner:
        return ModelRunner(model_fp32, kv_capacity_tokens=kv_capacity_tokens, block_size=block_size)

    return make


@pytest.fixture(scope="session")
def live(model_fp32, tokenizer):
    """The real SmolLM2 on the CPU device, no synthetic workload (tests compare record counts before and after)."""
    from api.live_api import LiveApi  # tests/api's helper (tests/ is on the path, as for every conftest here)

    from pdtop.engine.build import build_engine

    server = LiveApi(build_engine("cpu", loaded_model=model_fp32), tokenizer)
    yield server
    server.close()


@pytest.fixture
def mamba_gguf(tmp_path) -> Path:
    """A well-formed GGUF of an architecture pdtop does not run ("mamba")."""
    import gguf
    import numpy as np

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def yaml_bomb(levels: int = 6) -> str:
    """A YAML "billion laughs" value on one line: nested aliases, 9**levels strings behind 250 bytes (issue
    38's 382-byte `--config` had 9**7). Anything that walks it (a repr in an error message, say) expands it."""
    names = "abcdefghij"[:levels]
    parts = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    parts += [f"&{n} [{','.join([f'*{p}'] * 9)}]" for p, n in itertools.pairwise(names)]
    return "[" + ", ".join(parts) + "]"
