"""A real engine and API server on loopback, shared by a test module."""
from __future__ import annotations

import pytest
from live_api import LiveApi

from pdtop.engine.build import build_engine


@pytest.fixture(scope="module")
def live(model_fp32, tokenizer):
    """The real SmolLM2 on the CPU device, no synthetic workload."""
    server = LiveApi(build_engine("cpu", loaded_model=model_fp32), tokenizer)
    yield server
    server.close()
