"""`pdtop tune --device cuda` on real rounds, on a synthetic model: what the lent GPU machine runs
(it lacks gguf and the model file). Here, not in tests/tune/test_tune_command.py, so it needs only
torch, numpy, pyyaml, psutil, cuda-python and optuna (carried from bench/gpu_prepare.sh's wheels)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from pdtop.cli import main

HAS_CUDA = torch.cuda.is_available() and importlib.util.find_spec("cuda") is not None


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU, CUDA torch and cuda-python")
def test_cuda_runs_real_rounds_and_shows_each_candidate(capsys):
    """20 s of search (the default is measured whatever the budget): one line per candidate."""
    code = main(["tune", "--device", "cuda", "--model", "synthetic:smollm2-135m", "--slo-itl-ms", "1000",
                 "--budget-s", "20", "--json", "--workload",
                 "decode_bs=4,decode_prompt=64,long_tokens=512,long_prompts=1,decode_tokens=256"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert code == 0 and data["chosen"]["meets_slo"]
    assert data["decode_only_itl_ms"] > 0 and data["default"]["prefill_tok_s"] > 0
    shown = [line for line in captured.err.splitlines() if line.startswith("pdtop tune: [")]
    assert len(shown) == data["search"]["measured"] >= 1  # one line per candidate, as it is measured
