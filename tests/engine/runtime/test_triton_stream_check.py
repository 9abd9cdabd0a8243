"""The decode-stream check of Triton's kernel, on the CPU: `CudaDecoder` built on a CPU model with
torch.cuda's device plumbing (SM count, the current-stream context, the graph pool) stood in for, so
the switch itself runs: Triton checked on each new decode stream (it cannot run here, as where a
green context's stream refuses it), decode then on the torch-only path, every stream's graphs again."""
from __future__ import annotations

import contextlib
import types

import pytest
import torch

from pdtop.engine.model.synthetic import synthetic_model
from pdtop.engine.runtime import cuda_graphs
from pdtop.engine.runtime.cuda_graphs import CudaDecoder
from pdtop.engine.runtime.runner import ModelRunner


@pytest.fixture
def cpu_plumbing(monkeypatch):
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "get_device_properties", lambda device: types.SimpleNamespace(multi_processor_count=8))
    monkeypatch.setattr(cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "graph_pool_handle", lambda: object())
    captured: list[object] = []
    monkeypatch.setattr(CudaDecoder, "_capture", lambda self, stream: captured.append((stream, self.attention))
                        or {b: object() for b in self.buckets})
    return captured


@pytest.mark.parametrize("graphs", [True, False])
def test_a_stream_that_refuses_triton_moves_decode_to_the_torch_path(cpu_plumbing, monkeypatch, graphs):
    model = synthetic_model("synthetic:smollm2-135m", dtype="float32", num_layers=1, seed=0)
    kv = ModelRunner(model, kv_capacity_tokens=512).kv
    dec = CudaDecoder(model, kv, graphs=graphs, buckets=(1, 4), attention="torch-paged")
    dec.attention, dec.entries = "triton-paged", {}  # as if Triton had passed its check on the default stream
    dec.sync_streams({1: "stream 1", 2: "stream 2"})
    info = dec.describe()
    assert info["attention"] == "torch-paged", info
    assert info["attention_fallback"].startswith("triton-paged on a decode stream: "), info  # why, in words
    assert dec.paged and dec.use_graphs == graphs
    if graphs:  # every stream captured on the torch path, with its static block lists
        assert sorted(cpu_plumbing) == [("stream 1", "torch-paged"), ("stream 2", "torch-paged")]
        assert dec.entries == {1: min(dec.s_table.shape[1], kv.pool.num_blocks + 1),
                               4: min(4 * dec.s_table.shape[1], kv.pool.num_blocks + 4)}
        assert info["cuda_graphs"]["graphs"] == 4
    else:
        assert cpu_plumbing == [] and dec.entries == {}
    checked: list[tuple] = []
    monkeypatch.setattr(cuda_graphs, "check_attention", lambda *args: checked.append(args) or "")
    dec.sync_streams({1: "stream 1", 2: "stream 2", 3: "stream 3"})
    assert checked == []  # on the torch path now: Triton is not checked again
    assert len(cpu_plumbing) == (3 if graphs else 0)
