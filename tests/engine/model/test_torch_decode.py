"""The torch-only paged decode attention (the CUDA graphs' fallback when Triton cannot run), on the CPU:
against gather + SDPA (`reference`), its host-side block list, its chunk bound, the check that picks it,
and a whole decode step of a bucket padded as a graph runs it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from warm_start import prefill_to_decoding

from pdtop.engine.model.config import synthetic_config
from pdtop.engine.model.llama import ForwardBatch
from pdtop.engine.model.paged_attention import PagedDecode, reference
from pdtop.engine.model.synthetic import synthetic_model
from pdtop.engine.model.torch_decode import CHUNK_BYTES, RaggedDecode, chunk_entries, ragged_entries, torch_paged_decode
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.cuda_graphs import _torch_variants, _triton_variants, check_attention
from pdtop.engine.runtime.runner import ModelRunner

PAGE, BLOCKS = 16, 40
LENS = [1, 17, 100, 33, 64, 16, 1]  # odd lengths, one token, whole blocks; the last row is a graph's pad row


def _case(heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(kv_heads, BLOCKS * PAGE + 1, dim, generator=g).to(dtype) for _ in range(2))
    table = torch.zeros(len(LENS), 8, dtype=torch.int32)
    order, used = torch.randperm(BLOCKS, generator=g), 0
    for i, n in enumerate(LENS[:-1]):
        nb = -(-n // PAGE)
        table[i, :nb] = order[used:used + nb]
        used += nb
    table[-1, 0] = BLOCKS  # the pad row: its one position is the pad slot
    q = torch.randn(len(LENS), heads + 5, dim, generator=g).to(dtype)[:, :heads]  # rows strided as in qkv
    return q, k, v, table, torch.tensor(LENS, dtype=torch.int32)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 64), (6, 6, 32), (4, 1, 80)])
@pytest.mark.parametrize("chunk,extra", [(1 << 20, 0), (3, 11), (1, 2)])
def test_matches_gather_and_sdpa(dtype, tol, heads, kv_heads, dim, chunk, extra):
    """GQA, MHA and one KV head; in one chunk or many; the list padded past the rows' blocks."""
    q, k, v, table, ctx = _case(heads, kv_heads, dim, dtype)
    need = int(sum(-(-n // PAGE) for n in LENS))
    rd = RaggedDecode.of_table(table.numpy(), ctx.numpy(), PAGE, BLOCKS * PAGE, chunk, "cpu", need + extra)
    got = torch_paged_decode(q, k, v, rd, dim ** -0.5)
    want = reference(q, k, v, table, ctx, PAGE, dim ** -0.5)
    assert got.dtype == dtype and got.shape == want.shape
    assert want.abs().max() > 0.1
    assert (got.float() - want).abs().max() < tol


def test_unwritten_cache_past_the_context_is_never_read():
    """Slots past a row's length point at the pad slot: NaN in the rest of its last block changes nothing."""
    q, k, v, table, ctx = _case(8, 2, 64, torch.float32)
    want = torch_paged_decode(q, k, v, RaggedDecode.of_table(table.numpy(), ctx.numpy(), PAGE, BLOCKS * PAGE, 4,
                                                             "cpu"), 0.125)
    for row, n in enumerate(LENS[:-1]):
        block = int(table[row, (n - 1) // PAGE])
        if n % PAGE:
            k[:, block * PAGE + n % PAGE:(block + 1) * PAGE] = float("nan")
            v[:, block * PAGE + n % PAGE:(block + 1) * PAGE] = float("nan")
    got = torch_paged_decode(q, k, v, RaggedDecode.of_table(table.numpy(), ctx.numpy(), PAGE, BLOCKS * PAGE, 4,
                                                            "cpu"), 0.125)
    assert torch.isfinite(k).logical_not().any() and torch.equal(got, want)


def test_ragged_entries_list_each_rows_blocks_then_padding():
    table = np.array([[7, 3, 9], [5, 0, 0], [2, 8, 0]], dtype=np.int32)
    rows, blocks, counts = ragged_entries(table, np.array([33, 4, 16]), 16, entries=7)
    assert rows.tolist() == [0, 0, 0, 1, 2, 0, 0]
    assert blocks.tolist() == [7, 3, 9, 5, 2, 0, 0]
    assert counts.tolist() == [16, 16, 1, 4, 16, 0, 0]
    assert ragged_entries(table, np.array([33, 4, 16]), 16)[0].tolist() == [0, 0, 0, 1, 2]
    with pytest.raises(ValueError, match="needs 5 KV blocks, more than the 4 entries"):
        ragged_entries(table, np.array([33, 4, 16]), 16, entries=4)


def test_a_chunks_temporaries_stay_under_the_budget():
    """qwen3-8b in bfloat16: its gathered K/V alone are 64 KiB an entry, so a chunk takes a few thousand."""
    cfg = synthetic_config("qwen3-8b")
    args = (cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, 16, 2)
    n = chunk_entries(*args)
    kv_bytes = 2 * cfg.num_kv_heads * 16 * cfg.head_dim * 2
    assert 1000 < n < CHUNK_BYTES // kv_bytes
    assert chunk_entries(*args, budget=1) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_passes_the_torch_path_and_names_what_fails(dtype):
    cfg = synthetic_config("smollm2-135m")
    cpu = torch.device("cpu")
    assert check_attention(_torch_variants(), cfg, dtype, cpu, 16) == ""

    def wrong(q, k, v, t, c, page, scale):
        return torch.zeros_like(q)

    def broken(q, k, v, t, c, page, scale):
        raise RuntimeError("no C compiler\nmore")

    assert check_attention([wrong], cfg, dtype, cpu, 16).startswith("its output differs from gather + SDPA by ")
    assert check_attention([broken], cfg, dtype, cpu, 16) == "RuntimeError: no C compiler"
    assert check_attention([*_torch_variants(), wrong], cfg, dtype, cpu, 16) != ""  # every variant must agree


def test_the_triton_check_fails_in_one_line_without_a_gpu():
    problem = check_attention(_triton_variants(), synthetic_config("smollm2-135m"), torch.float32,
                              torch.device("cpu"), 16)
    assert problem and "\n" not in problem and len(problem) <= 200


def test_a_padded_decode_step_matches_the_cpu_path():
    """A synthetic model's paged cache after a prefill; three rows padded to a bucket of 4 (the pad row
    at the pad slot) with the block list a graph of that bucket holds (min(4 * W, pool blocks + 4)),
    through the whole forward: the CPU path's logits for the three rows, finite ones for the pad row."""
    from pdtop.engine.runtime.cuda_graphs import DecodeInputs

    model = synthetic_model("synthetic:smollm2-135m", dtype="float32", num_layers=2, seed=3)
    runner = ModelRunner(model, kv_capacity_tokens=1024)
    reqs = prefill_to_decoding(runner, [Request(i, list(range(100 + i, 100 + i + n)), SamplingParams(max_tokens=8))
                                        for i, n in enumerate((5, 40, 90))])
    cpu = runner.next_logits(reqs)  # the CPU path: gathered context, SDPA
    kv = runner.kv
    inp = DecodeInputs.of(kv, reqs).padded(4, kv)
    width = -(-min(model.config.max_context, kv.pool.capacity_tokens) // kv.block_size)
    entries = min(4 * width, kv.pool.num_blocks + 4)
    rd = RaggedDecode.of_table(inp.block_table, inp.context_lens, kv.block_size, kv.pad_slot, 5, "cpu", entries)
    paged = PagedDecode(torch.from_numpy(inp.block_table), torch.from_numpy(inp.context_lens), kv.block_size, 1, rd)
    batch = ForwardBatch(kv=kv, positions=torch.from_numpy(inp.positions), slots=torch.from_numpy(inp.slots),
                         num_decode=4, paged=paged)
    with torch.inference_mode():
        logits = model.logits(model.forward_layers(model.embed(torch.from_numpy(inp.ids)), batch, 0, model.num_layers))
    assert torch.isfinite(logits).all()
    assert (logits[:3] - cpu).abs().max() < 1e-4 * max(1.0, float(cpu.abs().max()))
    assert cpu.std() > 0
