"""The `prefill-first` policy: waiting prompts are prefilled whole, on every unit, before decode
continues (the classic continuous batching of Orca and early vLLM: prefill stalls decode)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Generic

from pdtop.engine.runtime.executor import S
from pdtop.engine.scheduling.policy import Policy, RoundStats

if TYPE_CHECKING:
    from pdtop.engine.scheduling.scheduler import Scheduler


class PrefillFirst(Policy, Generic[S]):
    name = "prefill-first"

    def __init__(self, scheduler: Scheduler[S]) -> None:
        self.scheduler = scheduler

    def in_flight(self) -> bool:
        return False  # a prefill starts and ends inside one round

    def step(self, stats: RoundStats) -> None:
        s, dev = self.scheduler, self.scheduler.device
        reqs = s.admit(s.max_prefill_tokens) if s.waiting else []
        if reqs:
            s.set_level(0 if s.pinned is None else s.pinned)
            stats.split = (dev.units, 0)
            state = s.executor.prefill_begin(reqs)
            work = s.executor.prefill_work(state, reqs, 0, s.num_layers)
            stats.charge(work)
            dev.run_whole(work)
            s.join_decode(reqs, s.executor.prefill_finish(state), stats)
        elif s.running:
            s.set_level(len(dev.groups) - 1 if s.pinned is None else s.pinned)
            stats.split = (0, dev.units)
            s.decode(stats, whole=True)
