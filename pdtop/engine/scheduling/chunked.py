"""The `chunked` policy: each step runs the decode batch plus one `chunk_size` piece of one prompt
in a single forward on every unit (chunked prefill, as vLLM and SGLang schedule it by default)."""
from __future__ import annotations

from typing import Generic

from pdtop.engine.records import PrefillProgress
from pdtop.engine.request import Request
from pdtop.engine.runtime.executor import S
from pdtop.engine.scheduling.policy import Host, Policy, RoundStats


class Chunked(Policy, Generic[S]):
    name = "chunked"

    def __init__(self, host: Host[S]) -> None:
        self.host = host
        self.req: Request | None = None  # the prompt being prefilled, a chunk a step

    def in_flight(self) -> bool:
        return self.req is not None

    def abort(self, req: Request) -> bool:
        if req is self.req:  # steps run whole: between two of its chunks
            self.req = None
        return False

    def progress(self) -> list[PrefillProgress]:
        r, layers = self.req, self.host.num_layers
        if r is None:
            return []
        return [PrefillProgress([r.id], r.prompt_len, layers * r.num_cached // r.prompt_len, layers, 0, r.num_cached)]

    def step(self, stats: RoundStats) -> None:
        h, dev = self.host, self.host.device
        if self.req is None and h.waiting and not h.draining:
            reqs = h.admit(None)
            if reqs:
                self.req = reqs[0]
        req = self.req
        if req is None and not h.running:
            return
        n = min(h.config.chunk_size, req.prompt_len - req.num_cached) if req else 0
        batch = list(h.running)
        work = h.executor.chunk_work(batch, req, n)
        stats.split = (dev.units, dev.units)
        t0 = dev.now()
        tokens, first = dev.run_whole(work)
        now = dev.now()
        stats.charge(work)
        if batch:
            stats.decode_s, stats.decode_bs = now - t0, len(batch)
        for r, tok in zip(batch, tokens, strict=True):
            h.append(r, tok, now, stats)
        h.running = [r for r in h.running if not r.finished]
        if req is not None and first is not None:  # this chunk ended req's prompt
            self.req = None
            h.join_decode([req], [first], stats)
