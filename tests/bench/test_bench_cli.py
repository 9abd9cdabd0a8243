"""`pdtop bench` (policy comparison) refuses what it cannot run in one line, before a request is sent."""
from __future__ import annotations

import subprocess
import sys

import pytest


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdtop", "bench", "--device", "sim:H100", "--policy", "pdmux",
                           "--quick", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, words", [
    # issue 42 item 19: it ran the decode batch, then failed on "the scenario's request 32 was rejected"
    (["--long-tokens", "100000"], "the workload's long prompt (100004 tokens with its output) is longer than the "
                                  "model's context (40960 tokens)"),
    (["--kv-tokens", "4096"], "the workload does not fit the KV cache: the scenario needs 213,024 KV tokens"),
    (["--dtype", "gguf"], "dtype gguf (compute on the file's quantized blocks) runs on the CPU, not a sim: device"),
    (["--dtype", "float32"], "a sim: device models bfloat16 weights and KV cache"),
])
def test_a_scenario_the_engine_cannot_run_is_refused_before_it_starts(args, words):
    out = bench(*args)
    lines = out.stderr.splitlines()  # no stage ran: no "bench pdmux: decoding: ..." line
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1, out.stderr
    assert lines[0].startswith("pdtop bench: error: ") and words in lines[0]
