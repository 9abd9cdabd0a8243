"""A real engine and API server on loopback, shared by the API tests."""
from __future__ import annotations

import pytest

from pdtop.engine.build import build_engine

from .live_api import LiveApi


@pytest.fixture(scope="session")
def live(model_fp32, tokenizer):
    """The real SmolLM2 on the CPU device, no synthetic workload (tests compare record counts before and after)."""
    server = LiveApi(build_engine("cpu", loaded_model=model_fp32), tokenizer)
    yield server
    server.close()
