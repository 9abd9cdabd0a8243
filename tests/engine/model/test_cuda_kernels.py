"""The CUDA path's attention, checked on the CPU: the Triton paged-decode kernel under Triton's
interpreter against gather + SDPA (skipped where Triton is not installed), and a chunk's prefix
attention taking SDPA's fused kernels."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pdtop.engine.model.paged_attention import _prefix, prefix_mode
from pdtop.engine.request import Request, RequestStatus, SamplingParams
from pdtop.engine.runtime.cuda_graphs import DecodeInputs

ROOT = Path(__file__).resolve().parents[3]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (pip install triton)")


def _interpret(code: str) -> dict:
    """Run `code` (which prints one JSON line last) with Triton's interpreter on the CPU."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


KERNEL_VS_SDPA = """
import json, torch
from pdtop.engine.model.paged_attention import paged_decode, reference
g = torch.Generator().manual_seed(0)
page, blocks, out = 16, 40, []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for heads, kv_heads, dim, splits in [(8, 2, 64, 1), (8, 2, 64, 4), (6, 6, 32, 2), (9, 3, 64, 16), (4, 1, 80, 2)]:
        k, v = (torch.randn(kv_heads, blocks * page + 1, dim, generator=g).to(dtype) for _ in range(2))
        lens = [1, 17, 100, 33, 64, 16]
        table = torch.zeros(len(lens), 8, dtype=torch.int32)
        order, used = torch.randperm(blocks, generator=g), 0
        for i, n in enumerate(lens):
            nb = -(-n // page)
            table[i, :nb] = order[used:used + nb]
            used += nb
        ctx = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(len(lens), heads + 5, dim, generator=g).to(dtype)[:, :heads]  # rows strided as in qkv
        got = paged_decode(q, k, v, table, ctx, page, dim ** -0.5, splits)
        want = reference(q, k, v, table, ctx, page, dim ** -0.5)
        out.append([str(dtype), heads, kv_heads, dim, splits, got.dtype == dtype,
                    (got.float() - want).abs().max().item(), want.abs().max().item()])
print(json.dumps(out))
"""


@needs_triton
def test_triton_paged_decode_matches_gather_and_sdpa():
    cases = _interpret(KERNEL_VS_SDPA)
    assert len(cases) == 15
    tolerance = {"torch.float32": 1e-5, "torch.float16": 2e-3, "torch.bfloat16": 2e-2}  # the output's rounding
    for dtype, *shape, same_dtype, err, scale in cases:
        assert same_dtype and scale > 0.1
        assert err < tolerance[dtype], (dtype, shape, err)


DECODE_STEP = """
import json, sys, torch
sys.path.insert(0, "tests")  # the tests' helpers (run from the repository root)
from pdtop.engine.model.llama import ForwardBatch
from pdtop.engine.model.loader import load_model
from pdtop.engine.model.paged_attention import PagedDecode
from pdtop.engine.request import Request, RequestStatus, SamplingParams
from pdtop.engine.runtime.cuda_graphs import DecodeInputs
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import append_token
from warm_start import prefill_to_decoding

runner = ModelRunner(load_model(None, dtype="float32"), kv_capacity_tokens=1024)
reqs = prefill_to_decoding(runner, [Request(i, list(range(100 + i, 100 + i + n)), SamplingParams(max_tokens=8))
                                    for i, n in enumerate((5, 40, 90))])
cpu = runner.next_logits(reqs)  # the CPU path: gathered context, SDPA
inp = DecodeInputs.of(runner.kv, reqs)
paged = PagedDecode(torch.from_numpy(inp.block_table), torch.from_numpy(inp.context_lens), runner.kv.block_size, 2)
batch = ForwardBatch(kv=runner.kv, positions=torch.from_numpy(inp.positions), slots=torch.from_numpy(inp.slots),
                     num_decode=len(reqs), paged=paged)
with torch.inference_mode():
    model = runner.model
    logits = model.logits(model.forward_layers(model.embed(torch.from_numpy(inp.ids)), batch, 0, model.num_layers))
print(json.dumps({"err": (logits - cpu).abs().max().item(), "scale": cpu.abs().max().item(),
                  "same_tokens": logits.argmax(-1).tolist() == cpu.argmax(-1).tolist()}))
"""


@needs_triton
def test_a_decode_step_through_the_paged_kernel_matches_the_cpu_path():
    """The real model, its paged cache after a prefill, and the CUDA path's decode inputs (`DecodeInputs`,
    `PagedDecode`) through the whole forward: the same logits as the CPU path's gather + SDPA."""
    got = _interpret(DECODE_STEP)
    assert got["same_tokens"] and got["err"] < 1e-3 * max(1.0, got["scale"]), got


def test_decode_inputs_point_at_each_rows_blocks(runner):
    r = runner(kv_capacity_tokens=512)
    reqs = [Request(i, list(range(50, 50 + n)), SamplingParams(max_tokens=4)) for i, n in enumerate((3, 16, 40))]
    for q in reqs:
        r.admit(q)
        q.status = RequestStatus.PREFILLING
    r.prefill(reqs)
    for q in reqs:
        q.output_ids.append(7)
        q.status = RequestStatus.DECODING
    r._grow(reqs)
    inp = DecodeInputs.of(r.kv, reqs)
    bs = r.kv.block_size  # each row's new K/V goes to the slot of its position in its own blocks
    slots = [q.table.blocks[q.num_cached // bs] * bs + q.num_cached % bs for q in reqs]
    assert inp.slots.tolist() == slots and inp.context_lens.tolist() == [4, 17, 41]
    assert inp.positions.tolist() == [3, 16, 40] and inp.ids.tolist() == [7, 7, 7]
    for row, q in enumerate(reqs):
        n = -(-int(inp.context_lens[row]) // r.kv.block_size)
        assert inp.block_table[row, :n].tolist() == q.table.blocks[:n]


# -- a chunk's attention to its cached prefix ------------------------------------------------
def test_prefix_modes_compute_the_runner_mask():
    """causal_lower_right, with grouped or expanded K/V, is the runner's prefix mask (query i sees S-n+i)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 24, 64, generator=g)
    k, v = (torch.randn(1, 2, 88, 64, generator=g) for _ in range(2))
    want = _prefix("mask", q, k, v, 4, 0.125)
    mask = torch.arange(88)[None, :] <= (64 + torch.arange(24))[:, None]
    assert torch.allclose(want, torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask, scale=0.125), atol=1e-5)
    for mode in ("gqa", "expand"):
        assert torch.allclose(_prefix(mode, q, k, v, 4, 0.125), want, atol=1e-5), mode
    assert prefix_mode(torch.device("cpu"), torch.float32, 64, 4) == "mask"


def test_cpu_chunked_prefill_takes_the_flash_kernel_not_math(runner):
    """On the CPU the chunk's mask with grouped K/V runs in torch's CPU flash kernel: the same tokens with
    SDPA restricted to it (math would be about 3x slower)."""
    def run() -> list[int]:
        r = runner(kv_capacity_tokens=512)
        long = Request(0, list(range(200, 300)), SamplingParams(max_tokens=2))
        r.admit(long)
        long.status = RequestStatus.PREFILLING
        firsts = []
        while long.num_cached < long.prompt_len:
            _, first = r.chunk_step([], long, 32)  # chunks after the first attend to a cached prefix
            firsts.append(first)
        return firsts

    free = run()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = run()
    assert flash == free and flash[-1] is not None
