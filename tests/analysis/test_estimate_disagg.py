"""The PD disaggregation row of `pdtop estimate` (1P1D over a link) against its formula."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_estimate import SEED_ROWS  # the seed's printed table, pinned there

from pdtop.analysis.estimate import estimate, notes, text_cells
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.roofline.cost import decode_bytes, prefill_flops
from pdtop.engine.roofline.gpu_specs import SPECS, parse_gpu
from pdtop.engine.roofline.kv import Link, parse_link

ROOT = Path(__file__).resolve().parents[2]
QWEN = synthetic_config("qwen3-8b")
H100 = SPECS["H100"]
RDMA400 = Link("rdma400", 50e9)


@pytest.mark.parametrize("gpu,model,decode_bs,context,prompt,link", [
    ("H100", "qwen3-8b", 32, 2048, 8192, "rdma400"),
    ("H100", "qwen3-8b", 32, 2048, 8192, "nvlink"),
    ("H200", "llama3.1-8b", 8, 4096, 32768, "rdma100"),
    ("A100", "qwen3-8b", 64, 1024, 512, "pcie5"),
    ("H20", "smollm2-135m", 16, 8192, 131072, "rdma200"),
    ("custom:sms=100,cc=9.0,bw=2e12,flops=5e14,mfu=0.4,bw_eff=0.9", "llama3.1-8b", 4, 512, 2048, "37.5"),
])
def test_the_row_is_its_formula(gpu, model, decode_bs, context, prompt, link):
    spec, cfg, lnk = parse_gpu(gpu), synthetic_config(model), parse_link(link)
    rows = estimate(spec, cfg, decode_bs, context, prompt, link=lnk)
    row = rows[-1]
    # decode on a whole GPU of its own: the decode-only step
    itl = decode_bytes(cfg, [context] * decode_bs) / (spec.mem_bw * spec.bw_eff)
    # the prompt prefilled on a whole second GPU, then its KV over the link
    prefill = prefill_flops(cfg, prompt) / (spec.peak_flops * spec.mfu)
    kv = prompt * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    transfer = kv / lnk.bandwidth
    assert (row.kind, row.gpus, row.name) == ("disagg", 2, f"PD disaggregation 1P1D over {lnk.name}")
    assert row.itl_ms == pytest.approx(itl * 1e3) == rows[0].itl_ms
    assert row.transfer_ms == pytest.approx(transfer * 1e3)
    assert row.kv_mb == pytest.approx(kv / 1e6)
    assert row.link_gb_s == pytest.approx(lnk.bandwidth / 1e9)
    assert row.prefill_ms == pytest.approx((prefill + transfer) * 1e3)
    assert row.tokens == pytest.approx((prefill + transfer) / itl)
    first = next(r for r in rows if r.kind == "prefill-first")  # the same whole-GPU prefill, without the transfer
    assert row.prefill_ms - row.transfer_ms == pytest.approx(first.prefill_ms)
    assert [r.gpus for r in rows[:-1]] == [1] * (len(rows) - 1)


def test_the_seed_scenario_over_each_link():
    by_link = {name: estimate(H100, QWEN, link=parse_link(name))[-1] for name in ("nvlink", "rdma400", "rdma100")}
    assert {round(r.kv_mb, 1) for r in by_link.values()} == {1208.0}  # 8192 x 147,456 bytes, whatever the link
    assert {n: round(r.transfer_ms, 2) for n, r in by_link.items()} == {"nvlink": 2.68, "rdma400": 24.16,
                                                                        "rdma100": 96.64}
    assert text_cells(by_link["rdma400"]) == ("PD disaggregation 1P1D over rdma400", "9 ms",
                                              "315 ms incl. 24 ms KV transfer", "36")
    assert text_cells(by_link["nvlink"])[2:] == ("293 ms incl. 3 ms KV transfer", "34")
    assert text_cells(by_link["rdma100"])[2:] == ("387 ms incl. 97 ms KV transfer", "44")


@pytest.mark.parametrize("link", ["nvlink", "rdma400", "rdma200", "rdma100", "pcie5", "12", "none"])
def test_the_seeds_rows_do_not_change(link):
    rows = estimate(H100, QWEN, link=parse_link(link))
    assert [text_cells(r)[1:] for r in rows[:len(SEED_ROWS)]] == SEED_ROWS
    assert [r.to_dict() for r in rows[:len(SEED_ROWS)]] == [r.to_dict() for r in estimate(H100, QWEN)]
    assert len(rows) == len(SEED_ROWS) + (link != "none")


def test_notes_say_what_it_costs_and_buys():
    lines = notes(estimate(H100, QWEN, link=RDMA400))
    text = " ".join(lines)
    assert "twice the GPUs" in text and "KV transfer on TTFT" in text and "no interference at all" in text
    assert "1,208 MB" in text and "50 GB/s" in text and "24 ms" in text
    assert notes(estimate(H100, QWEN)) == []


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pdtop", "estimate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_command_adds_the_row_over_rdma400_by_default():
    seed, default, none = run_cli("--link", "none"), run_cli(), run_cli("--link", "rdma400")
    assert seed.returncode == default.returncode == none.returncode == 0
    assert default.stdout == none.stdout
    body, table = default.stdout.splitlines(), seed.stdout.splitlines()
    assert body[0] == table[0]
    split = [re.split(r"\s{2,}", line.strip()) for line in body[1:len(table)]]
    assert split == [re.split(r"\s{2,}", line.strip()) for line in table[1:]]  # the seed's table first, wider
    cells = re.split(r"\s{2,}", body[len(table)].strip())
    assert cells == ["PD disaggregation 1P1D over rdma400", "9 ms", "315 ms incl. 24 ms KV transfer", "36"]
    assert body[len(table) + 1:] == notes(estimate(H100, QWEN, link=RDMA400)) and len(body) == len(table) + 4


def test_the_command_json():
    rows = json.loads(run_cli("--json").stdout)["rows"]
    assert [r["gpus"] for r in rows] == [1] * len(SEED_ROWS) + [2]
    last = rows[-1]
    assert last["kind"] == "disagg" and last["name"] == "PD disaggregation 1P1D over rdma400"
    assert round(last["transfer_ms"], 2) == 24.16 and last["kv_mb"] == pytest.approx(1207.959552)
    assert last["link_gb_s"] == 50 and round(last["prefill_ms"], 1) == 314.9 and round(last["itl_ms"], 1) == 8.7
    assert not any("transfer_ms" in r or "kv_mb" in r for r in rows[:-1])
    none = json.loads(run_cli("--json", "--link", "none").stdout)["rows"]
    assert len(none) == len(SEED_ROWS) and all(r["gpus"] == 1 for r in none)
    assert "disagg" not in {r["kind"] for r in none}
    number = json.loads(run_cli("--json", "--link", "37.5", "--gpu", "A100").stdout)["rows"][-1]
    assert number["name"] == "PD disaggregation 1P1D over 37.5 GB/s" and number["link_gb_s"] == 37.5


@pytest.mark.parametrize("link", ["infiniband", "0", "-50", "nan", "inf", "50GB/s", ""])
def test_a_bad_link_is_one_line_and_exit_2(link):
    out = run_cli("--link", link)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdtop estimate: error: --link:") and "rdma400" in lines[0]
