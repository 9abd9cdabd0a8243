"""The seed's estimate table (`pdtop estimate`); the roofline terms it prices with are tests/engine/roofline/."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdtop.analysis.estimate import estimate, out_of_range, text_cells
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.roofline.gpu_specs import SPECS, parse_gpu
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

ROOT = Path(__file__).resolve().parents[2]
QWEN = synthetic_config("qwen3-8b")
H100 = SPECS["H100"]

# The seed's printed table.
SEED_ROWS = [
    ("9 ms", "-", "-"),
    ("one step of 299 ms", "291 ms", "0"),
    ("74 ms x 4 steps", "295 ms", "4"),
    ("19 ms x 16 steps", "306 ms", "16"),
    ("9 ms", "480 ms", "55"),
    ("11 ms", "480 ms", "43"),
    ("15 ms", "480 ms", "33"),
]


def test_estimate_reproduces_the_seed():
    rows = estimate(H100, QWEN)
    assert [text_cells(r)[1:] for r in rows] == SEED_ROWS
    assert [r.name for r in rows][-3:] == ["PD mux 80/52, S_SAT=44", "PD mux 80/52, S_SAT=66", "PD mux 80/52, S_SAT=88"]
    assert [r.steps for r in rows if r.kind == "chunked"] == [4, 16]


def test_estimate_follows_the_split_choice():
    rows = estimate(H100, QWEN, decode_bs=12)
    assert {(r.prefill_sms, r.decode_sms) for r in rows if r.kind == "pdmux"} == {(104, 28)}
    manual = PdmuxConfig(sm_group_num=3, manual_divisions=[[64, 68, 1]])
    assert {r.decode_sms for r in estimate(H100, QWEN, config=manual) if r.kind == "pdmux"} == {68}


def test_an_overlapped_split_prices_decode_on_the_whole_device_and_its_take_off_the_prefill():
    overlapped = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 0, 1]], overlap_decode_full_sm=True)
    rows = {r.s_sat: r for r in estimate(H100, QWEN, config=overlapped) if r.kind == "pdmux"}
    exclusive = {r.s_sat: r for r in estimate(H100, QWEN, config=PdmuxConfig(
        sm_group_num=3, manual_divisions=[[104, 28, 1]])) if r.kind == "pdmux"}
    whole = next(r for r in estimate(H100, QWEN) if r.kind == "decode-only")
    assert {(r.prefill_sms, r.decode_sms) for r in rows.values()} == {(104, 132)}
    assert all("overlapped" in r.name for r in rows.values())
    for s_sat, row in rows.items():
        assert row.itl_ms == pytest.approx(whole.itl_ms)  # decode as on the whole device
        # decode takes S_SAT SMs, 28 of them its own: the prefill keeps 104 - (S_SAT - 28)
        assert row.prefill_ms == pytest.approx(exclusive[s_sat].prefill_ms * 104 / (104 - (s_sat - 28)), rel=1e-6)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pdtop", "estimate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_estimate_command_text_and_json():
    text = run_cli("--link", "none")  # the seed's table alone (the default adds a PD disaggregation row)
    assert text.returncode == 0 and text.stderr == "", text.stderr  # the seed's inputs are all in range
    body = text.stdout.splitlines()
    assert "approach" in body[1] and "decode ITL" in body[1] and "prefill time" in body[1]
    cells = [re.split(r"\s{2,}", line.strip()) for line in body[2:]]
    assert [tuple(c[1:]) for c in cells] == SEED_ROWS
    assert cells[0][0] == "decode only (reference)" and cells[-1][0] == "PD mux 80/52, S_SAT=88"
    assert len(body) == 2 + len(SEED_ROWS)

    out = run_cli("--json", "--link", "none")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data) == ["rows"]
    rows = data["rows"]
    assert "prefill_ms" not in rows[0] and round(rows[0]["itl_ms"]) == 9
    assert [round(r["prefill_ms"]) for r in rows[1:]] == [291, 295, 306, 480, 480, 480]
    assert [round(r["itl_ms"]) for r in rows[1:]] == [299, 74, 19, 9, 11, 15]
    assert [round(r["tokens"]) for r in rows[1:]] == [0, 4, 16, 55, 43, 33]
    assert [r.get("steps") for r in rows[2:4]] == [4, 16]
    assert rows[4]["tokens"] != round(rows[4]["tokens"])  # unrounded


@pytest.mark.parametrize("args,word", [
    (["--gpu", "B300"], "B300"), (["--model", "gpt-9"], "gpt-9"), (["--decode-bs", "0"], "--decode-bs"),
    (["--chunks", "2048,x"], "--chunks"), (["--s-sat", "-1"], "--s-sat"),
    (["--gpu", "custom:sms=132,cc=9.0,bw=3e12"], "flops"),
])
def test_estimate_command_bad_values(args, word):
    out = run_cli(*args)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


@pytest.mark.parametrize("args, words", [
    (["--s-sat", "44,500"], ["S_SAT 500 is more than the H100's 132 SMs"]),
    (["--prompt", "1000000"],  # 147 GB of KV: the seed's "an 80 GB GPU" cannot hold it
     ["the prompt (1,000,000 tokens) is longer than synthetic:qwen3-8b's context (40,960 tokens)",
      "the prompt's KV (147.5 GB) is more than the H100's memory (80 GiB, 85.9 GB)"]),
    (["--decode-bs", "256", "--context", "8192"],
     ["the weights, the decode batch's KV and the prompt's KV (325.6 GB) are more than the H100's memory"]),
])
def test_inputs_outside_the_physical_range_are_said_and_still_priced(args, words):
    """Issue 42 item 19: `--s-sat 500` on 132 SMs and a 147 GB KV transfer on an 80 GB GPU passed without
    a word. Each is a warning line on stderr; the table (or --json) is printed as before."""
    for fmt in ([], ["--json"]):
        out = run_cli(*args, *fmt)
        lines = out.stderr.splitlines()
        assert out.returncode == 0 and len(lines) == len(words), out.stderr
        for line, w in zip(lines, words, strict=True):
            assert line.startswith("pdtop estimate: warning: ") and w in line
        assert (json.loads(out.stdout)["rows"] if fmt else "approach" in out.stdout)


def test_a_custom_gpu_names_its_memory():
    assert parse_gpu("custom:sms=132,cc=9.0,bw=3e12,flops=1e15,mem_gib=24").mem_gib == 24
    assert parse_gpu("custom:sms=132,cc=9.0,bw=3e12,flops=1e15").mem_gib is None  # unknown: nothing is said
    small = parse_gpu("custom:sms=132,cc=9.0,bw=3e12,flops=1e15,mem_gib=24,name=L4ish")
    # 15.1 GB of weights, 9.7 GB for 32 x 2048 tokens, 1.2 GB for 8192 (147,456 bytes a token)
    assert out_of_range(small, QWEN, 32, 2048, 8192, [44]) == [
        "the weights, the decode batch's KV and the prompt's KV (26.0 GB) are more than the L4ish's memory "
        "(24 GiB, 25.8 GB): every row assumes they fit on one GPU"]
    assert out_of_range(H100, QWEN, 32, 2048, 8192, [44, 66, 88, 132]) == []
