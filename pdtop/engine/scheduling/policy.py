"""What a scheduling policy is: the `Policy` the scheduler swaps at a round boundary, the `Host` it
runs on, and the `RoundStats` a round fills in.

A policy decides what prefill work runs beside the decode batch and holds the requests it is
prefilling; the scheduler (the `Host`) keeps everything the four policies share: the waiting
queue and admission, the decode batch and its step, the one place a token is appended
(`append`, through `tokens.append_token`), how a request ends early, and the records.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from pdtop.engine.devices.base import Device, Work
from pdtop.engine.records import DisaggState, KvTransfer, PrefillProgress, RequestRecord, RoundRecord
from pdtop.engine.request import Request
from pdtop.engine.roofline.kv import Link
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.scheduling.level_rule import SloRule
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable


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


class Host(Protocol[S]):
    """The scheduler as a policy sees it."""

    device: Device
    executor: Executor[S]
    config: PdmuxConfig
    table: SplitTable
    pinned: int | None
    levels: SloRule
    waiting: deque[Request]
    waiting_tokens: int
    running: list[Request]
    rejected: list[Request]  # reported as "finish" records at the end of the round
    ending: dict[int, str]  # request id -> finish reason: aborted while its policy had its work in flight
    draining: bool  # a policy switch waits for this one: take no new request
    max_prefill_tokens: int
    link: Link | None

    @property
    def num_layers(self) -> int: ...

    def admit(self, limit_tokens: int | None) -> list[Request]:
        """Waiting requests FIFO whose KV the executor admits, while they fit `limit_tokens` (None: one)."""

    def reject(self, req: Request, why: str) -> None:
        """`req` (already out of the waiting queue) can never run: it finishes "rejected"."""

    def append(self, req: Request, token: int, now: float, stats: RoundStats) -> None:
        """The one way a sampled token is appended (its records, its KV freed when it finishes)."""

    def decode(self, stats: RoundStats, whole: bool) -> None:
        """The decode batch's step, on the decode side (or on every unit with `whole`)."""

    def join_decode(self, reqs: list[Request], tokens: list[int], stats: RoundStats, at: float | None = None) -> None:
        """Prefilled requests take their first tokens and join the decode batch (or end, if aborted meanwhile)."""

    def end(self, req: Request, reason: str, now: float) -> RequestRecord:
        """Finish `req` early ("abort", "stop"), its KV freed; its finish record."""

    def set_level(self, level: int) -> None: ...


class Policy(Protocol):
    """One way of sharing the device between prefill and decode (pdmux, chunked, prefill-first, disagg).
    A policy subclasses it for the defaults: nothing held between steps, nothing to release."""

    name: str

    def step(self, stats: RoundStats) -> None:
        """One round: the decode step and what prefill work runs beside it; no new request while the
        host is draining."""
        ...

    def in_flight(self) -> bool:
        """Whether it holds requests it has begun to prefill (the policy cannot be swapped out then)."""
        ...

    def abort(self, req: Request) -> bool:
        """`req` is aborted: True while its work is in flight here (it ends when that work is done, its
        reason in `Host.ending`); else let go of it if held between steps: False, it ends now."""
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
