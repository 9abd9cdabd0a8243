"""Request intake: new requests, the waiting-queue caps, refusals and aborts, from any thread.

Everything here is under one lock, shared by every thread that hands the engine work; the
engine's thread takes what came in at each round boundary (`take`). A request that would
pass a cap (`QueueLimits`) is refused with `QueueFullError`, counted by source, and
reported at the next boundary as a request that arrived and finished "rejected".
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sized
from dataclasses import dataclass
from typing import Protocol

from pdtop.engine.errors import QueueFullError
from pdtop.engine.records import RequestRecord
from pdtop.engine.request import SOURCES, Request, SamplingParams
from pdtop.engine.scheduling.admission import QueueLimits
from pdtop.engine.updates import OnUpdate

MAX_REFUSALS_HELD = 4096  # refusals reported per round boundary at most; the counts in `refused` keep the rest


class WaitingQueue(Protocol):
    """What intake needs of the scheduler: its waiting queue, and adding to it."""

    @property
    def waiting(self) -> Sized: ...

    @property
    def waiting_tokens(self) -> int: ...

    def add(self, req: Request) -> RequestRecord: ...


@dataclass
class Taken:
    """What came in since the last round boundary, for the engine's thread to report and apply."""

    added: list[RequestRecord]  # arrivals of the requests now in the scheduler
    watched: list[tuple[Request, OnUpdate]]  # of those, the ones whose caller wants their tokens
    refusals: list[tuple[RequestRecord, RequestRecord]]  # (arrival, "rejected" finish) of each refusal
    aborts: list[tuple[Request, str]]


class Intake:
    def __init__(self, scheduler: WaitingQueue, limits: QueueLimits, *, temperature: float, seed: int) -> None:
        self.scheduler, self.limits = scheduler, limits
        self.temperature, self.seed = temperature, seed
        self.lock = threading.Lock()
        self.refused = dict.fromkeys(SOURCES, 0)  # requests refused over the caps, by source
        self.wake = threading.Event()  # set when work comes in, so an idle round ends early
        self._next_id = 0
        self._incoming: deque[tuple[Request, OnUpdate | None]] = deque()
        self._incoming_tokens = 0
        self._aborts: deque[tuple[Request, str]] = deque()
        self._refusals: deque[tuple[RequestRecord, RequestRecord]] = deque(maxlen=MAX_REFUSALS_HELD)

    def submit(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool, arrival: float | None,
               source: str, now: float) -> tuple[Request, RequestRecord]:
        """A request added to the scheduler now, with the engine's sampling defaults, and its arrival record."""
        with self.lock:
            params = SamplingParams(temperature=self.temperature, seed=self.seed + self._next_id,
                                    max_tokens=max_tokens, ignore_eos=ignore_eos)
            req = self._new_request(prompt_ids, params, source, now if arrival is None else arrival)
            return req, self.scheduler.add(req)

    def enqueue(self, prompt_ids: list[int], params: SamplingParams, source: str, on_update: OnUpdate | None,
                now: float) -> Request:
        """A request queued for the next round boundary."""
        with self.lock:
            req = self._new_request(prompt_ids, params, source, now)
            self._incoming.append((req, on_update))
            self._incoming_tokens += req.prompt_len
        self.wake.set()
        return req

    def abort(self, req: Request, reason: str) -> None:
        with self.lock:
            self._aborts.append((req, reason))
        self.wake.set()

    def check_room(self, prompt_tokens: int, source: str, now: float) -> None:
        """QueueFullError if a request of `prompt_tokens` would pass a cap (the refusal is reported)."""
        with self.lock:
            self._check_room(prompt_tokens, source, now)

    def take(self) -> Taken:
        """At a round boundary: queued requests join the scheduler (under the lock, so a concurrent
        cap check never misses them); refusals and aborts are handed over."""
        with self.lock:
            added = [self.scheduler.add(req) for req, _ in self._incoming]
            watched = [(req, cb) for req, cb in self._incoming if cb is not None]
            self._incoming.clear()
            self._incoming_tokens = 0
            taken = Taken(added, watched, list(self._refusals), list(self._aborts))
            self._refusals.clear()
            self._aborts.clear()
        return taken

    @property
    def empty(self) -> bool:
        return not self._incoming

    def _new_request(self, prompt_ids: list[int], params: SamplingParams, source: str, now: float) -> Request:
        """Under the lock: a new request with the next id, if the queue has room."""
        self._check_room(len(prompt_ids), source, now)
        req = Request(self._next_id, list(prompt_ids), params, now, source=source)
        self._next_id += 1
        return req

    def _check_room(self, prompt_tokens: int, source: str, now: float) -> None:
        try:
            self.limits.check(len(self.scheduler.waiting) + len(self._incoming),
                              self.scheduler.waiting_tokens + self._incoming_tokens, prompt_tokens)
        except QueueFullError:
            rid, self._next_id = self._next_id, self._next_id + 1
            self.refused[source] += 1
            self._refusals.append((RequestRecord("arrival", rid, now, prompt_tokens, source=source),
                                   RequestRecord("finish", rid, now, prompt_tokens, finish_reason="rejected",
                                                 source=source)))
            raise
