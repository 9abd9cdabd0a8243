"""The `prefill-first` policy: waiting prompts are prefilled whole, on every unit, before decode
continues (the classic continuous batching of Orca and early vLLM: prefill stalls decode)."""
from __future__ import annotations

from typing import Generic

from pdtop.engine.runtime.executor import S
from pdtop.engine.scheduling.policy import Host, Policy, RoundStats


class PrefillFirst(Policy, Generic[S]):
    name = "prefill-first"

    def __init__(self, host: Host[S]) -> None:
        self.host = host

    def in_flight(self) -> bool:
        return False  # a prefill starts and ends inside one round

    def step(self, stats: RoundStats) -> None:
        h, dev = self.host, self.host.device
        reqs = h.admit(h.max_prefill_tokens) if h.waiting else []
        if reqs:
            h.set_level(0 if h.pinned is None else h.pinned)
            stats.split = (dev.units, 0)
            state = h.executor.prefill_begin(reqs)
            work = h.executor.prefill_work(state, reqs, 0, h.num_layers)
            stats.charge(work)
            dev.run_whole(work)
            h.join_decode(reqs, h.executor.prefill_finish(state), stats)
        elif h.running:
            h.set_level(len(dev.groups) - 1 if h.pinned is None else h.pinned)
            stats.split = (0, dev.units)
            h.decode(stats, whole=True)
