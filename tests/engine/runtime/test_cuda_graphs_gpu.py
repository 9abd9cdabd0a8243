"""On a GPU: decode graphs replay with the torch-only paged attention as with Triton's kernel, agree with
gather + SDPA, and the counts say which way each step ran (a synthetic model: no gguf needed)."""
from __future__ import annotations

import pytest
import torch
from warm_start import prefill_to_decoding

from pdtop.engine.model.synthetic import synthetic_model
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.cuda_graphs import CudaDecoder
from pdtop.engine.runtime.graph_counts import GRAPHS_OFF, NO_BUCKET, NO_GRAPH, replayed
from pdtop.engine.runtime.runner import ModelRunner

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def decoding():
    model = synthetic_model("synthetic:smollm2-135m", dtype="bfloat16", device="cuda", num_layers=4, seed=7)
    runner = ModelRunner(model, kv_capacity_tokens=4096, cuda_graphs=False)
    prompts = [list(range(1000 + 7 * i, 1000 + 7 * i + n)) for i, n in enumerate((5, 200, 33))]
    reqs = prefill_to_decoding(runner, [Request(i, ids, SamplingParams(max_tokens=8)) for i, ids in enumerate(prompts)])
    gather = CudaDecoder(model, runner.kv, graphs=False, attention="sdpa-gather")
    runner.cuda = gather  # not paged: the runner gathers K/V and runs SDPA
    want = runner.next_logits(reqs).float().clone()
    return runner, reqs, want


@pytest.mark.parametrize("attention", ["torch-paged", "triton-paged"])
def test_graphs_replay_and_agree_with_gather(decoding, attention):
    runner, reqs, want = decoding
    dec = CudaDecoder(runner.model, runner.kv, buckets=(1, 4, 8), attention=attention)
    if dec.attention != attention:
        if attention == "torch-paged":
            pytest.fail(f"the torch-only path must run on any GPU: {dec.fallback_reason}")
        pytest.skip(f"Triton cannot run here: {dec.fallback_reason}")
    runner.cuda = dec
    stream = torch.cuda.Stream()
    dec.sync_streams({stream.cuda_stream: stream})
    info = dec.describe()["cuda_graphs"]
    assert info["graphs"] == 3 and info["streams"] == 1 and not info["failed"], info
    with torch.cuda.stream(stream):
        before = dec.counts.snapshot()
        graph = runner.next_logits(reqs).float().clone()  # 3 rows: bucket 4, one pad row
        assert replayed(before, dec.counts.snapshot())
        dec.use_graphs = False
        eager = runner.next_logits(reqs).float().clone()
        dec.use_graphs = True
    stream.synchronize()
    scale = float(want.abs().max())
    for name, got in (("graph", graph), ("eager", eager)):
        assert float((got - want).abs().max()) <= 0.02 * scale, (name, attention)
    runner.next_logits(reqs)  # the default stream has no graphs
    totals = dec.describe()["cuda_graphs"]["steps"]
    assert totals == {"replays": 1, "eager_steps": 2, "eager": {GRAPHS_OFF: 1, NO_GRAPH: 1}}, totals
    if attention == "torch-paged":
        assert "torch_paged" in dec.describe() and dec.entries[4] == min(4 * dec.s_table.shape[1],
                                                                         runner.kv.pool.num_blocks + 4)


def test_a_batch_over_the_largest_bucket_runs_eagerly(decoding):
    runner, reqs, want = decoding
    dec = CudaDecoder(runner.model, runner.kv, buckets=(1, 2), attention="torch-paged")
    runner.cuda = dec
    stream = torch.cuda.Stream()
    dec.sync_streams({stream.cuda_stream: stream})
    with torch.cuda.stream(stream):
        got = runner.next_logits(reqs).float().clone()
    stream.synchronize()
    assert dec.counts.streams[stream.cuda_stream].eager == {NO_BUCKET: 1}
    assert float((got - want).abs().max()) <= 0.02 * float(want.abs().max())


def test_triton_failing_on_a_decode_stream_switches_every_stream_to_the_torch_path(decoding, monkeypatch):
    """Triton's kernel is checked on each decode stream before graphs are captured there (a green
    context's stream may not take a kernel loaded in the primary context): where it fails, decode
    takes the torch-only path and every stream's graphs are captured again on it."""
    runner, reqs, want = decoding
    dec = CudaDecoder(runner.model, runner.kv, buckets=(1, 4), attention="triton-paged")
    if dec.attention != "triton-paged":
        pytest.skip(f"Triton cannot run here: {dec.fallback_reason}")
    runner.cuda = dec
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    dec.sync_streams({first.cuda_stream: first})
    assert dec.attention == "triton-paged" and dec.describe()["cuda_graphs"]["graphs"] == 2
    real = CudaDecoder._check_on
    monkeypatch.setattr(CudaDecoder, "_check_on", lambda self, stream, variants: "refused here" if stream is second
                        else real(self, stream, variants))
    dec.sync_streams({first.cuda_stream: first, second.cuda_stream: second})
    info = dec.describe()
    assert info["attention"] == "torch-paged" and "triton-paged on a decode stream: refused here" in \
        info["attention_fallback"], info
    assert info["cuda_graphs"]["graphs"] == 4 and not info["cuda_graphs"]["failed"], info
    for stream in (first, second):
        with torch.cuda.stream(stream):
            before = dec.counts.snapshot()
            got = runner.next_logits(reqs).float().clone()
            assert replayed(before, dec.counts.snapshot())
        stream.synchronize()
        assert float((got - want).abs().max()) <= 0.02 * float(want.abs().max())
