"""The runner's decode step on CUDA: paged attention in place, replayed from CUDA graphs.

A decode step of a 36-layer model is about 1,900 torch calls; launched one by one from
Python that is 6-12 ms of host time against about 6 ms of GPU work at batch 32, so decode
would be bound by launches and every split level would look alike. As SGLang's
`cuda_graph_runner` does per stream group, `CudaDecoder` captures the whole decode forward
(embed, layers, final norm, LM head) once per decode stream (one per split level, so each
graph runs on that level's green context) and batch-size bucket, into one shared memory
pool; a step copies its inputs into the static buffers and replays the smallest bucket
that holds the batch, padded rows pointing at the cache's pad slot. Batches above the
largest bucket, streams without graphs (e.g. the default stream) and `--no-cuda-graph`
run the same forward eagerly. Decode attention reads the paged cache in place
(`model/paged_attention.py`); if the Triton kernel cannot run here, decode falls back to
the CPU path's gather + SDPA, without graphs, and `describe()` says why.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pdtop.engine.model.llama import ForwardBatch, LlamaModel
from pdtop.engine.model.paged_attention import PagedDecode, decode_splits, paged_decode, prefix_mode, reference
from pdtop.engine.runtime.kv_cache import KVCache

if TYPE_CHECKING:
    from pdtop.engine.request import Request

log = logging.getLogger(__name__)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def bucket_for(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `rows` decode rows; None above the largest (run eagerly)."""
    return next((b for b in sorted(buckets) if b >= rows), None)


@dataclass
class DecodeInputs:
    """One decode step's inputs on the host: a row per request."""

    ids: np.ndarray  # int64 last tokens
    positions: np.ndarray  # int64
    slots: np.ndarray  # int64: where each row's new K/V goes
    block_table: np.ndarray  # int32 [n, W]: each row's blocks (W: the longest row's)
    context_lens: np.ndarray  # int32: positions + 1

    @classmethod
    def of(cls, kv: KVCache, reqs: list[Request]) -> DecodeInputs:
        bs = kv.block_size
        pos = np.fromiter((r.num_cached for r in reqs), dtype=np.int64, count=len(reqs))
        width = int(pos.max()) // bs + 1
        table = np.zeros((len(reqs), width), dtype=np.int32)
        for i, r in enumerate(reqs):
            blocks = r.table.blocks[:width]
            table[i, :len(blocks)] = blocks
        slots = table[np.arange(len(reqs)), pos // bs].astype(np.int64) * bs + pos % bs
        ids = np.fromiter((r.last_token for r in reqs), dtype=np.int64, count=len(reqs))
        return cls(ids, pos, slots, table, (pos + 1).astype(np.int32))


class CudaDecoder:
    def __init__(self, model: LlamaModel, kv: KVCache, *, graphs: bool = True,
                 buckets: Sequence[int] = DEFAULT_BUCKETS):
        self.model, self.kv, self.cfg = model, kv, model.config
        self.device = model.device
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"CUDA graph buckets must be positive batch sizes, got {buckets}")
        self.attention, self.fallback_reason = "triton-paged", ""
        problem = self._check_kernel()
        if problem:
            self.attention, self.fallback_reason = "sdpa-gather", problem
            log.warning("pdtop: the Triton paged-attention kernel cannot run here (%s); decode gathers K/V", problem)
        cfg = self.cfg
        self.prefix_mode = prefix_mode(self.device, model.dtype, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads)
        self.graphs_wanted = graphs
        self.use_graphs = graphs and self.paged  # may be switched off later (gpu_check compares)
        self._graphs: dict[int, dict[int, torch.cuda.CUDAGraph]] = {}  # stream handle -> bucket -> graph
        self.failed: dict[int, str] = {}
        self.capture_s = 0.0
        self.pool_bytes = 0
        self._pool: Any = None
        if self.use_graphs:
            self._make_static()

    @property
    def paged(self) -> bool:
        return self.attention == "triton-paged"

    # -- checks and buffers ----------------------------------------------------------------
    @torch.inference_mode()
    def _check_kernel(self) -> str:
        """Why the Triton kernel cannot be used here ("" when it runs and agrees with gather + SDPA)."""
        cfg, dev, dt = self.cfg, self.device, self.model.dtype
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            page, blocks, lens = self.kv.block_size, 12, [1, 37, 4 * self.kv.block_size]  # 4 blocks a row
            k, v = (torch.randn(cfg.num_kv_heads, blocks * page + 1, cfg.head_dim, generator=g, device=dev,
                                dtype=dt) for _ in range(2))
            q = torch.randn(len(lens), cfg.num_heads, cfg.head_dim, generator=g, device=dev, dtype=dt)
            table = torch.randperm(blocks, generator=g, device=dev)[:len(lens) * 4].view(len(lens), 4).int()
            ctx = torch.tensor(lens, device=dev, dtype=torch.int32)
            scale = cfg.head_dim ** -0.5
            want = reference(q, k, v, table, ctx, page, scale)
            for splits in (1, 4):
                got = paged_decode(q, k, v, table, ctx, page, scale, splits).float()
                if not torch.allclose(got, want, atol=3e-2, rtol=3e-2):
                    return f"its output differs from gather + SDPA by {(got - want).abs().max().item():.3g}"
        except Exception as exc:  # no Triton, no compiler for this GPU, ...
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]
        return ""

    @torch.inference_mode()
    def _make_static(self) -> None:
        """Inputs every graph reads (sized for the largest bucket), their pinned host staging, and the
        one logits buffer every graph writes, so graphs keep no outputs of their own."""
        n, dev = self.buckets[-1], self.device
        width = -(-min(self.cfg.max_context, self.kv.pool.capacity_tokens) // self.kv.block_size)
        self.s_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.s_pos = torch.zeros(n, dtype=torch.int64, device=dev)
        self.s_slots = torch.full((n,), self.kv.pad_slot, dtype=torch.int64, device=dev)
        self.s_table = torch.full((n, width), self.kv.pool.num_blocks, dtype=torch.int32, device=dev)
        self.s_ctx = torch.ones(n, dtype=torch.int32, device=dev)
        self.s_logits = torch.zeros(n, self.cfg.vocab, dtype=torch.float32, device=dev)
        pin = torch.cuda.is_available()
        self.h_rows = torch.zeros(3, n, dtype=torch.int64, pin_memory=pin)  # ids, positions, slots
        self.h_table = torch.zeros(n, width, dtype=torch.int32, pin_memory=pin)
        self.h_ctx = torch.zeros(n, dtype=torch.int32, pin_memory=pin)

    # -- the forward -----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, table: torch.Tensor,
                 ctx: torch.Tensor) -> torch.Tensor:
        rows = ids.shape[0]
        paged = PagedDecode(table, ctx, self.kv.block_size, decode_splits(rows, self.cfg.num_kv_heads, self.sms))
        batch = ForwardBatch(kv=self.kv, positions=pos, slots=slots, num_decode=rows, paged=paged)
        h = self.model.forward_layers(self.model.embed(ids), batch, 0, self.cfg.num_layers)
        return self.model.logits(h)

    def paged_batch(self, inp: DecodeInputs) -> PagedDecode:
        """Device copies of the block table and lengths, for a forward that mixes decode rows with others."""
        return PagedDecode(self._to_device(inp.block_table), self._to_device(inp.context_lens), self.kv.block_size,
                           decode_splits(len(inp.ids), self.cfg.num_kv_heads, self.sms))

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def logits(self, inp: DecodeInputs) -> torch.Tensor:
        """Float32 logits `[n, vocab]` of a decode step (a view of the graphs' buffer when replayed: read
        it before the next step). Runs on the current stream; replays if it has a graph for the batch."""
        rows = len(inp.ids)
        bucket = bucket_for(rows, self.buckets) if self.use_graphs else None
        graphs = self._graphs.get(torch.cuda.current_stream(self.device).cuda_stream) if bucket else None
        if graphs is None or bucket not in graphs:
            dev = self._to_device
            return self._forward(dev(inp.ids), dev(inp.positions), dev(inp.slots), dev(inp.block_table),
                                 dev(inp.context_lens))
        self._stage(inp, bucket)
        graphs[bucket].replay()
        return self.s_logits[:rows]

    def _stage(self, inp: DecodeInputs, bucket: int) -> None:
        """Copy a step's inputs into the static buffers; rows past the batch point at the pad slot."""
        rows, width = len(inp.ids), inp.block_table.shape[1]
        h = self.h_rows.numpy()
        h[0, :rows], h[1, :rows], h[2, :rows] = inp.ids, inp.positions, inp.slots
        h[0, rows:bucket], h[1, rows:bucket], h[2, rows:bucket] = 0, 0, self.kv.pad_slot
        t = self.h_table.numpy()
        t[:rows, :width] = inp.block_table
        t[rows:bucket, 0] = self.kv.pool.num_blocks  # the pad slot's "block"
        c = self.h_ctx.numpy()
        c[:rows], c[rows:bucket] = inp.context_lens, 1
        for dst, src in ((self.s_ids, self.h_rows[0]), (self.s_pos, self.h_rows[1]), (self.s_slots, self.h_rows[2]),
                         (self.s_ctx, self.h_ctx)):
            dst[:bucket].copy_(src[:bucket], non_blocking=True)
        self.s_table[:bucket, :width].copy_(self.h_table[:bucket, :width], non_blocking=True)

    # -- graphs per stream -----------------------------------------------------------------
    def sync_streams(self, streams: dict[int, torch.cuda.Stream]) -> None:
        """Have graphs for exactly these decode streams (a device calls this when its levels change):
        free those of streams gone, capture every bucket on streams new."""
        for key in [k for k in self._graphs if k not in streams]:
            del self._graphs[key]
        if not self.use_graphs:
            return
        new = {k: s for k, s in streams.items() if k not in self._graphs and k not in self.failed}
        if not new:
            return
        t0, before = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        for key, stream in new.items():
            try:
                self._graphs[key] = self._capture(stream)
            except Exception as exc:  # this stream decodes eagerly; the others keep their graphs
                self.failed[key] = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
                log.warning("pdtop: CUDA graph capture failed on a decode stream (%s); it runs eagerly",
                            self.failed[key])
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        self.pool_bytes += torch.cuda.memory_reserved(self.device) - before

    @torch.inference_mode()
    def _capture(self, stream: Any) -> dict[int, torch.cuda.CUDAGraph]:
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        with torch.cuda.stream(stream):
            for b in reversed(self.buckets):  # largest first: later captures reuse its pool memory
                args = (self.s_ids[:b], self.s_pos[:b], self.s_slots[:b], self.s_table[:b], self.s_ctx[:b])
                self.s_logits[:b].copy_(self._forward(*args))  # warm-up: compiles kernels, sets up cuBLAS here
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    self.s_logits[:b].copy_(self._forward(*args))
                finally:
                    graph.capture_end()
                graphs[b] = graph
        return graphs

    def describe(self) -> dict[str, Any]:
        graphs = sum(len(g) for g in self._graphs.values())
        line = (f"CUDA graphs: {graphs} (batch {self.buckets[0]}..{self.buckets[-1]} on {len(self._graphs)} decode "
                f"streams), pool {self.pool_bytes / 2**20:.0f} MiB, captured in {self.capture_s:.1f} s"
                if self.use_graphs else "CUDA graphs: off")
        return {
            "attention": self.attention, "attention_fallback": self.fallback_reason or None,
            "prefix_attention": self.prefix_mode,
            "cuda_graphs": {"enabled": self.use_graphs, "buckets": list(self.buckets),
                            "streams": len(self._graphs), "graphs": graphs,
                            "pool_mib": round(self.pool_bytes / 2**20, 1), "capture_s": round(self.capture_s, 2),
                            "failed": list(self.failed.values()), "line": line},
        }
