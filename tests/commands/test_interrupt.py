"""Ctrl+C (a real SIGINT) in `generate`, the policy `bench` and `tune`: exit 130 with one line on stderr, the
output's line ended, and what was measured kept (`bench --url`'s case is in test_bench_url.py)."""
from __future__ import annotations

import os
import sys
import time

from sigint import interrupt

PDTOP = [sys.executable, "-m", "pdtop"]


def test_ctrl_c_in_generate_ends_the_line_and_says_what_was_done():
    printed: list[str] = []

    def streaming(proc) -> bool:  # reads the pipe itself: communicate() after it reads the same file
        printed.append(os.read(proc.stdout.fileno(), 1 << 16).decode())
        return "".join(printed).count(" ") >= 5

    rc, out, err = interrupt([*PDTOP, "generate", "--model", "synthetic:smollm2-135m", "--layers", "1",
                              "--max-tokens", "8000", "hello"], streaming)
    assert rc == 130 and out.endswith("\n")
    assert err.count("\n") == 1 and "finish: interrupted (Ctrl+C)" in err
    decoded = int(err.split("decode ")[1].split()[0])
    assert decoded >= 4 and " tok/s" in err
    assert len(("".join(printed) + out).split()) in (decoded, decoded + 1)  # every token printed was counted


def test_ctrl_c_in_the_policy_bench_prints_the_policies_that_finished():
    seen: list[str] = []

    def second_policy_running(proc) -> bool:
        seen.append(os.read(proc.stderr.fileno(), 1 << 16).decode())
        return "bench chunked:" in "".join(seen)

    rc, out, err = interrupt([*PDTOP, "bench", "--device", "sim:H100", "--long-prompts", "400", "--long-tokens",
                              "256", "--decode-bs", "1"], second_policy_running)
    assert rc == 130
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("policy")) + 1:]
    rows = [line.split()[0] for line in table if line and not line.startswith(("ms unless", "/device"))]
    assert rows == ["pdmux"]
    assert err.strip().splitlines()[-1] == "pdtop bench: interrupted: 1 of 4 policies finished; the figures above " \
                                           "are theirs"


def test_ctrl_c_in_tune_is_one_line():
    started = time.monotonic()
    rc, out, err = interrupt([*PDTOP, "tune", "--device", "sim:H100", "--slo-itl-ms", "12", "--workload",
                              "long_prompts=40"], lambda _: time.monotonic() - started > 3)  # a run of ~10 s
    assert rc == 130 and out == "" and err == "pdtop tune: interrupted\n"
