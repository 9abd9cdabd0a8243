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
(`model/paged_attention.py`): the Triton kernel first; if it cannot run here (no Triton, no
compiler, ...), the torch-only paged path (`model/torch_decode.py`, `attention: "torch-paged"`),
which graphs capture as well; only if that fails too, the CPU path's gather + SDPA, without
graphs. `describe()` says which and why. Every step is counted per decode stream, replayed or
eager and why (`graph_counts.py`), so a measurement can tell whether its graphs really ran.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pdtop.engine.model.config import ModelConfig
from pdtop.engine.model.llama import ForwardBatch, LlamaModel
from pdtop.engine.model.paged_attention import PagedDecode, decode_splits, paged_decode, prefix_mode, reference
from pdtop.engine.model.torch_decode import RaggedDecode, chunk_entries, ragged_entries, torch_paged_decode
from pdtop.engine.runtime.graph_counts import OVER_ENTRIES, GraphCounts, bucket_for, route
from pdtop.engine.runtime.kv_cache import KVCache

if TYPE_CHECKING:
    from pdtop.engine.request import Request

log = logging.getLogger(__name__)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PAGED = ("triton-paged", "torch-paged")  # read the paged cache in place; CUDA graphs capture both
ATTENTIONS = (*PAGED, "sdpa-gather")
__all__ = ["DEFAULT_BUCKETS", "CudaDecoder", "DecodeInputs", "bucket_for", "check_attention"]

# (q, k, v, block_table, context_lens, block_size, scale) -> [n, heads, d]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def check_attention(variants: Sequence[Attend], cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                    block_size: int) -> str:
    """Why these decode attentions cannot be used here ("" when each runs and agrees with gather + SDPA
    in float32), on a few rows of the model's head shapes: one token, an odd length, four blocks."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        page, blocks, lens = block_size, 12, [1, 37, 4 * block_size]  # 4 blocks a row
        k, v = (torch.randn(cfg.num_kv_heads, blocks * page + 1, cfg.head_dim, generator=g, device=device,
                            dtype=dtype) for _ in range(2))
        q = torch.randn(len(lens), cfg.num_heads, cfg.head_dim, generator=g, device=device, dtype=dtype)
        table = torch.randperm(blocks, generator=g, device=device)[:len(lens) * 4].view(len(lens), 4).int()
        ctx = torch.tensor(lens, device=device, dtype=torch.int32)
        scale = cfg.head_dim ** -0.5
        want = reference(q, k, v, table, ctx, page, scale)
        for attend in variants:
            got = attend(q, k, v, table, ctx, page, scale).float()
            if not torch.allclose(got, want, atol=3e-2, rtol=3e-2):
                return f"its output differs from gather + SDPA by {(got - want).abs().max().item():.3g}"
    except Exception as exc:  # no Triton, no compiler for this GPU, ...
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]
    return ""


def _triton_variants() -> list[Attend]:
    """The kernel with one context split, and with four (then merged)."""
    def run(splits: int) -> Attend:
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: torch.Tensor, c: torch.Tensor, page: int,
                   scale: float) -> torch.Tensor:
            return paged_decode(q, k, v, t, c, page, scale, splits)
        return attend
    return [run(1), run(4)]


def _torch_variants() -> list[Attend]:
    """In one chunk, and in chunks of 3 entries over a list padded past the rows' blocks."""
    def run(chunk: int, extra: int) -> Attend:
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: torch.Tensor, c: torch.Tensor, page: int,
                   scale: float) -> torch.Tensor:
            table, lens = t.cpu().numpy(), c.cpu().numpy()
            need = int(((lens + page - 1) // page).sum())
            rd = RaggedDecode.of_table(table, lens, page, k.shape[1] - 1, chunk, q.device, need + extra)
            return torch_paged_decode(q, k, v, rd, scale)
        return attend
    return [run(1 << 20, 0), run(3, 5)]


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

    def padded(self, rows: int, kv: KVCache) -> DecodeInputs:
        """These inputs as `rows` rows (a graph's bucket): each extra row decodes token 0 at position 0
        into the cache's pad slot, its one block the pad slot's (`num_blocks`), so it reads only that."""
        extra = rows - len(self.ids)
        table = np.zeros((rows, self.block_table.shape[1]), dtype=np.int32)
        table[:len(self.ids)] = self.block_table
        table[len(self.ids):, 0] = kv.pool.num_blocks
        zeros = np.zeros(extra, dtype=np.int64)
        return DecodeInputs(np.concatenate((self.ids, zeros)), np.concatenate((self.positions, zeros)),
                            np.concatenate((self.slots, np.full(extra, kv.pad_slot, dtype=np.int64))), table,
                            np.concatenate((self.context_lens, np.ones(extra, dtype=np.int32))))


class CudaDecoder:
    def __init__(self, model: LlamaModel, kv: KVCache, *, graphs: bool = True,
                 buckets: Sequence[int] = DEFAULT_BUCKETS, attention: str | None = None):
        """`attention`: one of ATTENTIONS to use (tests, comparisons); None: Triton's kernel, else
        the torch-only paged path, else gather + SDPA, the first that runs here."""
        self.model, self.kv, self.cfg = model, kv, model.config
        self.device = model.device
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"CUDA graph buckets must be positive batch sizes, got {buckets}")
        if attention is not None and attention not in ATTENTIONS:
            raise ValueError(f"decode attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        cfg = self.cfg
        self.chunk = chunk_entries(cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim,
                                   kv.block_size, model.dtype.itemsize)
        self.attention, self.fallback_reason = self._choose(attention)
        self.prefix_mode = prefix_mode(self.device, model.dtype, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads)
        self.graphs_wanted = graphs
        self.use_graphs = graphs and self.paged  # may be switched off later (gpu_check compares)
        self._graphs: dict[int, dict[int, torch.cuda.CUDAGraph]] = {}  # stream handle -> bucket -> graph
        self.failed: dict[int, str] = {}
        self._checked: set[int] = set()  # decode streams Triton's kernel was checked on
        self.counts = GraphCounts()  # every step, per decode stream: replayed, or eager and why
        self.entries: dict[int, int] = {}  # torch-paged: bucket -> length of its static block list
        self.capture_s = 0.0
        self.pool_bytes = 0
        self._pool: Any = None
        if self.use_graphs:
            self._make_static()

    @property
    def paged(self) -> bool:
        return self.attention in PAGED

    # -- checks and buffers ----------------------------------------------------------------
    @torch.inference_mode()
    def _choose(self, want: str | None) -> tuple[str, str]:
        """The first paged attention that runs here (or `want`'s), and why the ones before it do not."""
        reasons: list[str] = []
        for name, variants in (("triton-paged", _triton_variants), ("torch-paged", _torch_variants)):
            if want is not None and want != name:
                continue
            problem = check_attention(variants(), self.cfg, self.model.dtype, self.device, self.kv.block_size)
            if not problem:
                return name, "; ".join(reasons)
            reasons.append(f"{name}: {problem}")
            log.warning("pdtop: decode attention %s cannot run here (%s)", name, problem)
        if want is None or want == "torch-paged":
            log.warning("pdtop: decode gathers K/V and runs without CUDA graphs")
        return "sdpa-gather", "; ".join(reasons)

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
        if self.attention == "torch-paged":
            self._make_entries()

    def _make_entries(self) -> None:
        """torch-paged's static block list per bucket: the pool holds at most num_blocks; each pad row
        takes one more."""
        width, dev = self.s_table.shape[1], self.device
        self.entries = {b: min(b * width, self.kv.pool.num_blocks + b) for b in self.buckets}
        p = max(self.entries.values())
        self.s_entries = torch.zeros(3, p, dtype=torch.int64, device=dev)  # rows, blocks, counts
        self.h_entries = torch.zeros(3, p, dtype=torch.int64, pin_memory=torch.cuda.is_available())

    # -- the forward -----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, paged: PagedDecode) -> torch.Tensor:
        batch = ForwardBatch(kv=self.kv, positions=pos, slots=slots, num_decode=ids.shape[0], paged=paged)
        h = self.model.forward_layers(self.model.embed(ids), batch, 0, self.cfg.num_layers)
        return self.model.logits(h)

    def _paged(self, table: torch.Tensor, ctx: torch.Tensor, entries: torch.Tensor | None) -> PagedDecode:
        """What the layers' attention reads; `entries` `[3, P]` (rows, blocks, counts): torch-paged's."""
        rows, bs = table.shape[0], self.kv.block_size
        ragged = (None if entries is None else
                  RaggedDecode.of(entries[0], entries[1], entries[2], rows, bs, self.kv.pad_slot, self.chunk))
        return PagedDecode(table, ctx, bs, decode_splits(rows, self.cfg.num_kv_heads, self.sms), ragged)

    def _static_paged(self, bucket: int) -> PagedDecode:
        entries = self.s_entries[:, :self.entries[bucket]] if self.entries else None
        return self._paged(self.s_table[:bucket], self.s_ctx[:bucket], entries)

    def paged_batch(self, inp: DecodeInputs) -> PagedDecode:
        """Device copies of the block table and lengths, for an eager forward (alone, or decode rows mixed
        with a prompt chunk)."""
        entries = None
        if self.attention == "torch-paged":
            entries = self._to_device(np.stack(ragged_entries(inp.block_table, inp.context_lens, self.kv.block_size)))
        return self._paged(self._to_device(inp.block_table), self._to_device(inp.context_lens), entries)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def logits(self, inp: DecodeInputs) -> torch.Tensor:
        """Float32 logits `[n, vocab]` of a decode step (a view of the graphs' buffer when replayed: read
        it before the next step). Runs on the current stream; replays if it has a graph for the batch."""
        rows = len(inp.ids)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        graphs = self._graphs.get(stream)
        bucket, why = route(rows, self.buckets, graphs_on=self.use_graphs, captured=graphs,
                            failed=stream in self.failed)
        if bucket is not None and self.entries and self._blocks(inp) + bucket - rows > self.entries[bucket]:
            bucket, why = None, OVER_ENTRIES
        self.counts.record(stream, bucket, why)
        if graphs is None or bucket is None:
            dev = self._to_device
            return self._forward(dev(inp.ids), dev(inp.positions), dev(inp.slots), self.paged_batch(inp))
        self._stage(inp, bucket)
        graphs[bucket].replay()
        return self.s_logits[:rows]

    def _blocks(self, inp: DecodeInputs) -> int:
        bs = self.kv.block_size
        return int(((inp.context_lens.astype(np.int64) + bs - 1) // bs).sum())

    def _stage(self, inp: DecodeInputs, bucket: int) -> None:
        """Copy a step's inputs, padded to the bucket (`DecodeInputs.padded`), into the static buffers."""
        p = inp.padded(bucket, self.kv)
        width = p.block_table.shape[1]
        h = self.h_rows.numpy()
        h[0, :bucket], h[1, :bucket], h[2, :bucket] = p.ids, p.positions, p.slots
        self.h_table.numpy()[:bucket, :width] = p.block_table
        self.h_ctx.numpy()[:bucket] = p.context_lens
        for dst, src in ((self.s_ids, self.h_rows[0]), (self.s_pos, self.h_rows[1]), (self.s_slots, self.h_rows[2]),
                         (self.s_ctx, self.h_ctx)):
            dst[:bucket].copy_(src[:bucket], non_blocking=True)
        self.s_table[:bucket, :width].copy_(self.h_table[:bucket, :width], non_blocking=True)
        if self.entries:  # torch-paged: the same rows as one list of blocks
            n, e = self.entries[bucket], self.h_entries.numpy()
            e[:, :n] = np.stack(ragged_entries(p.block_table, p.context_lens, self.kv.block_size, n))
            self.s_entries[:, :n].copy_(self.h_entries[:, :n], non_blocking=True)

    # -- graphs per stream -----------------------------------------------------------------
    def sync_streams(self, streams: dict[int, torch.cuda.Stream]) -> None:
        """Have graphs for exactly these decode streams (a device calls this when its levels change):
        free those of streams gone, capture every bucket on streams new."""
        for key in [k for k in self._graphs if k not in streams]:
            del self._graphs[key]
        for key in [k for k in self.failed if k not in streams]:  # a later stream may reuse the handle
            del self.failed[key]
        self._checked &= set(streams)
        unchecked = {k: s for k, s in streams.items() if k not in self._checked}
        if self._triton_fails_on(unchecked):
            self._graphs.clear()  # captured with Triton's kernel: every stream again, on the torch path
        self._checked |= set(unchecked)
        if not self.use_graphs:
            return
        new = {k: s for k, s in streams.items() if k not in self._graphs and k not in self.failed}
        if not new:
            return
        t0, before = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        if not self._graphs:  # a pool whose graphs are all freed cannot take captures again (the caching
            # allocator asserts its use count, as the H100 run showed): each fresh set of graphs takes a new one
            self._pool, self.pool_bytes = torch.cuda.graph_pool_handle(), 0
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
    def _triton_fails_on(self, streams: dict[int, torch.cuda.Stream]) -> bool:
        """Whether Triton's kernel fails on one of these streams, having switched to the torch-only path
        if so. Triton loads a kernel into the context current at its first launch (the primary one);
        that it then launches on a green context's stream is what SGLang relies on, not what the
        driver docs say, so it is checked on each decode stream before graphs are captured there."""
        if self.attention != "triton-paged":
            return False
        problem = next((p for p in (self._check_on(s, _triton_variants()) for s in streams.values()) if p), "")
        if not problem:
            return False
        self.attention = "torch-paged"
        self.fallback_reason = "; ".join(r for r in (self.fallback_reason, f"triton-paged on a decode stream: "
                                                     f"{problem}") if r)
        log.warning("pdtop: the Triton decode kernel fails on a decode stream (%s); decode runs the torch-only "
                    "paged path", problem)
        if self.use_graphs:
            self._make_entries()
        return True

    def _check_on(self, stream: torch.cuda.Stream, variants: list[Attend]) -> str:
        with torch.cuda.stream(stream):  # the check reads its results back: it waits for its kernels
            return check_attention(variants, self.cfg, self.model.dtype, self.device, self.kv.block_size)

    @torch.inference_mode()
    def _capture(self, stream: Any) -> dict[int, torch.cuda.CUDAGraph]:
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        with torch.cuda.stream(stream):
            for b in reversed(self.buckets):  # largest first: later captures reuse its pool memory
                args = (self.s_ids[:b], self.s_pos[:b], self.s_slots[:b])
                self.s_logits[:b].copy_(self._forward(*args, self._static_paged(b)))  # warm-up: compiles, cuBLAS
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    self.s_logits[:b].copy_(self._forward(*args, self._static_paged(b)))
                finally:
                    graph.capture_end()
                graphs[b] = graph
        return graphs

    def describe(self) -> dict[str, Any]:
        graphs = sum(len(g) for g in self._graphs.values())
        eager = f", {len(self.failed)} eager (capture failed)" if self.failed else ""
        line = (f"CUDA graphs: {graphs} (batch {self.buckets[0]}..{self.buckets[-1]} on {len(self._graphs)} decode "
                f"streams{eager}), pool {self.pool_bytes / 2**20:.0f} MiB, captured in {self.capture_s:.1f} s"
                if self.use_graphs else "CUDA graphs: off")
        out: dict[str, Any] = {
            "attention": self.attention, "attention_fallback": self.fallback_reason or None,
            "prefix_attention": self.prefix_mode,
            "cuda_graphs": {"enabled": self.use_graphs, "buckets": list(self.buckets),
                            "streams": len(self._graphs), "graphs": graphs, "eager_streams": len(self.failed),
                            "pool_mib": round(self.pool_bytes / 2**20, 1), "capture_s": round(self.capture_s, 2),
                            "failed": list(self.failed.values()), "steps": self.counts.totals().as_dict(),
                            "line": line},
        }
        if self.entries:  # torch-paged: each bucket's static block list, read whole every step
            out["torch_paged"] = {"entries": {str(b): p for b, p in self.entries.items()},
                                  "chunk_entries": self.chunk}
        return out
