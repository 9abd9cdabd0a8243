"""What a scheduling policy is: the `Policy` the scheduler swaps at a round boundary, and the
`RoundStats` a round fills in.

A policy decides what prefill work runs beside the decode batch and holds the requests it is
prefilling; the scheduler it runs on keeps everything the four policies share: the waiting
queue and admission, the decode batch and its step, the one place a token is appended
(`Scheduler.append`, through `tokens.append_token`), how a request ends early, and the records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pdtop.engine.devices.base import Work
from pdtop.engine.records import DisaggState, KvTransfer, PrefillProgress, RequestRecord, RoundRecord
from pdtop.engine.request import Request


@dataclass
class RoundStats:
    """What one round did, accumulated while it runs."""

    flops: float = 0.0
    bytes: float = 0.0
    tokens: int = 0
    decode_bs: int = 0
    decode_s: float = 0.0
    split: tuple[int, int] | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    side: list[RoundRecord | KvTransfer] = field(default_factory=list)  # disagg: prefill rounds, KV transfers
    instance: str | None = None  # the round's `instance` ("decode" under disagg)
    disagg: DisaggState | None = None

    def charge(self, work: Work, fraction: float = 1.0) -> None:
        """Count `fraction` of `work`'s FLOPs and bytes in this round."""
        self.flops += fraction * work.flops
        self.bytes += fraction * work.bytes


class Policy(Protocol):
    """One way of sharing the device between prefill and decode (pdmux, chunked, prefill-first, disagg).
    A policy subclasses it for the defaults: nothing held between steps, nothing to release."""

    name: str

    def step(self, stats: RoundStats) -> None:
        """One round: the decode step and what prefill work runs beside it; no new request while the
        scheduler is draining."""
        ...

    def in_flight(self) -> bool:
        """Whether it holds requests it has begun to prefill (the policy cannot be swapped out then)."""
        ...

    def abort(self, req: Request) -> bool:
        """`req` is aborted: True while its work is in flight here (it ends when that work is done, its
        reason in `Scheduler.ending`); else let go of it if held between steps: False, it ends now."""
        return False

    def progress(self) -> list[PrefillProgress]:
        """The round's `prefills`: each prefill in flight; `layers_done` of `layers_total` is the share of
        its `tokens` done, counted in layers (a token through every layer counts `layers_total`)."""
        return []

    def leave(self) -> None:
        """It is swapped out, with nothing in flight."""
        return None

    def close(self) -> None:
        """The engine closes: release what it holds (threads, links)."""
        return None
