"""The link a prompt's KV crosses under `disagg`: from the prefill instance's pool to the decode instance's.

Transfers go one after another (one direction, FIFO), each as soon as its prefill is done
and the link is free. `VirtualLink` (sim devices): a transfer takes bytes / bandwidth on the
device's virtual clock; the copy is bookkeeping. `CopyLink` (cpu): a thread of its own copies
the K/V rows between the two pools for real, paced to the link's bandwidth when one is given
(it sleeps out the rest of bytes / bandwidth), so the decode side never waits on the copy.
"""
from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from pdtop.engine.request import BlockTable, Request
from pdtop.engine.roofline.kv import LINKS, Link, transfer_time

DEFAULT_SIM_LINK = Link("rdma400", LINKS["rdma400"])  # the estimate's default
UNPACED = "memory copy"  # a CopyLink's name without --link: as fast as memory copies


@dataclass(eq=False)
class Transfer:
    """One request's KV on its way to the decode pool, with its first token (sampled by the prefill instance)."""

    req: Request
    first_token: int
    table: BlockTable  # the decode instance's reserved slots it fills
    nbytes: int
    reserved: float  # when the decode instance reserved `table`
    ready: float  # when its prefill ended
    start: float = math.nan
    end: float = math.nan
    future: Future[None] | None = None


class KvLink(ABC):
    def __init__(self, link: Link | None):
        self.link = link
        self.name = link.name if link is not None else UNPACED
        self.queue: deque[Transfer] = deque()  # queued or in flight, oldest first

    @property
    def bytes_in_flight(self) -> int:
        return sum(t.nbytes for t in self.queue)

    @abstractmethod
    def send(self, t: Transfer, copy: Callable[[], None]) -> None:
        """Queue `t`; `copy` moves its K/V rows from the prefill pool into `t.table`."""

    @abstractmethod
    def done(self, now: float) -> list[Transfer]:
        """The transfers that have ended by `now`, oldest first, taken off the queue."""

    def next_end(self) -> float | None:
        """When the oldest transfer ends, where that is known in advance (the virtual link)."""
        return None

    def wait(self) -> None:
        """Block until the oldest transfer has ended (a real copy; the virtual link has nothing to wait for)."""
        return

    def close(self) -> None:
        """Stop the copying thread, if there is one."""
        return


class VirtualLink(KvLink):
    def __init__(self, link: Link | None):
        super().__init__(link or DEFAULT_SIM_LINK)
        self._free_at = -math.inf

    def send(self, t: Transfer, copy: Callable[[], None]) -> None:
        assert self.link is not None
        t.start = max(t.ready, self._free_at)
        t.end = self._free_at = t.start + transfer_time(t.nbytes, self.link)
        copy()
        self.queue.append(t)

    def done(self, now: float) -> list[Transfer]:
        out = []
        while self.queue and self.queue[0].end <= now:
            out.append(self.queue.popleft())
        return out

    def next_end(self) -> float | None:
        return self.queue[0].end if self.queue else None


class CopyLink(KvLink):
    def __init__(self, link: Link | None, pin: Callable[[], None] | None = None):
        """`pin` runs on the copying thread before each copy (the CPU device keeps it on the prefill
        instance's cores, the side that sends, as SGLang's prefill side pushes its KV)."""
        super().__init__(link)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdtop-kv-link")
        self._pin = pin

    def send(self, t: Transfer, copy: Callable[[], None]) -> None:
        def job() -> None:
            if self._pin is not None:
                self._pin()
            t.start = time.perf_counter()
            copy()
            if self.link is not None:
                due = t.start + transfer_time(t.nbytes, self.link)
                while (rest := due - time.perf_counter()) > 0:
                    time.sleep(rest)
            t.end = time.perf_counter()

        t.future = self._pool.submit(job)
        self.queue.append(t)

    def done(self, now: float) -> list[Transfer]:
        out = []
        while self.queue and self.queue[0].future is not None and self.queue[0].future.done():
            t = self.queue.popleft()
            assert t.future is not None
            t.future.result()  # a copy that raised raises here, on the engine thread
            out.append(t)
        return out

    def wait(self) -> None:
        if self.queue and self.queue[0].future is not None:
            self.queue[0].future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
