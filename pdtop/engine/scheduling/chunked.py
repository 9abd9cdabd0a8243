"""The `chunked` policy: each step runs the decode batch plus one `chunk_size` piece of one prompt
in a single forward on every unit (chunked prefill, as vLLM and SGLang schedule it by default)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Generic

from pdtop.engine.records import PrefillProgress
from pdtop.engine.request import Request
from pdtop.engine.runtime.executor import S
from pdtop.engine.scheduling.policy import Policy, RoundStats

if TYPE_CHECKING:
    from pdtop.engine.scheduling.scheduler import Scheduler


class Chunked(Policy, Generic[S]):
    name = "chunked"

    def __init__(self, scheduler: Scheduler[S]) -> None:
        self.scheduler = scheduler
        self.req: Request | None = None  # the prompt being prefilled, a chunk a step

    def in_flight(self) -> bool:
        return self.req is not None

    def abort(self, req: Request) -> bool:
        if req is self.req:  # steps run whole: between two of its chunks
            self.req = None
        return False

    def progress(self) -> list[PrefillProgress]:
        r, layers = self.req, self.scheduler.num_layers
        if r is None:
            return []
        return [PrefillProgress([r.id], r.prompt_len, layers * r.num_cached // r.prompt_len, layers, 0, r.num_cached)]

    def step(self, stats: RoundStats) -> None:
        s, dev = self.scheduler, self.scheduler.device
        if self.req is None and s.waiting and not s.draining:
            reqs = s.admit(None)
            if reqs:
                self.req = reqs[0]
        req = self.req
        if req is None and not s.running:
            return
        n = min(s.config.chunk_size, req.prompt_len - req.num_cached) if req else 0
        batch = list(s.running)
        work = s.executor.chunk_work(batch, req, n)
        stats.split = (dev.units, dev.units)
        t0 = dev.now()
        tokens, first = dev.run_whole(work)
        now = dev.now()
        stats.charge(work)
        if batch:
            stats.decode_s, stats.decode_bs = now - t0, len(batch)
        for r, tok in zip(batch, tokens, strict=True):
            s.append(r, tok, now, stats)
        s.running = [r for r in s.running if not r.finished]
        if req is not None and first is not None:  # this chunk ended req's prompt
            self.req = None
            s.join_decode([req], [first], stats)
