"""The `disagg` policy: PD disaggregation 1P1D, as SGLang runs it, in two instances.

A prefill instance and a decode instance, each with its own share of the hardware and its
own KV pool (the scheduler's executor is the decode instance; `Executor.twin` makes the
prefill one). A request moves through SGLang's queues:

1. **reserving** (SGLang's decode prealloc queue, `Scheduler.waiting`): the decode instance
   reserves the KV slots for prompt + max_tokens first; a request whose slots do not fit
   waits here, and the prefill instance never sees it;
2. **prefill queue**: slots reserved; the prefill instance takes requests FIFO into one
   whole-prompt batch (its own pool holds their prompts' KV) and samples their first tokens;
3. **transfer queue**: each prompt's KV crosses the link into the reserved slots (`kv_link`);
4. the prefill pool's blocks are freed and the request joins the decode batch, its first
   token timed at the transfer's end.

Decode never runs prefill. On `sim:` the two instances are two whole simulated GPUs; on
the CPU, the two core sets of the most even split level. A request aborted inside the pair
(reserved, prefilling or on the link) ends once its KV has landed in the decode pool.
"""
from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic

from pdtop.engine.devices.base import Device, Work
from pdtop.engine.errors import ControlError, EngineError, KVCapacityError
from pdtop.engine.records import DisaggState, KvTransfer, PrefillProgress, RoundRecord
from pdtop.engine.request import BlockTable, Request, RequestStatus
from pdtop.engine.runtime.executor import S
from pdtop.engine.runtime.kv_link import CopyLink, KvLink, Transfer, VirtualLink
from pdtop.engine.scheduling.policies import DISAGG_ON_CUDA
from pdtop.engine.scheduling.policy import Policy, RoundStats

if TYPE_CHECKING:
    from pdtop.engine.scheduling.scheduler import Scheduler


@dataclass(eq=False)
class _Reserved:
    req: Request
    table: BlockTable  # the decode instance's slots for it
    at: float


@dataclass(eq=False)
class _Batch(Generic[S]):
    items: list[_Reserved]
    state: S
    work: Work[object]
    tokens: int
    started: float


def check_disagg(device: Device) -> None:
    """ControlError unless `device` can run two instances: a simulated GPU (two of them), or a CPU
    with two cores at least. One GPU cannot hold both instances."""
    if device.kind == "cuda":
        raise ControlError("policy", DISAGG_ON_CUDA)
    if device.kind == "cpu" and device.units < 2:
        raise ControlError("policy", "disagg needs two cores at least (one per instance)")


def even_level(groups: list[tuple[int, int]]) -> int:
    """The split level whose two sides are closest to even, both non-empty (the CPU's two instances)."""
    both = [i for i, (p, d) in enumerate(groups) if p > 0 and d > 0]
    if not both:
        raise EngineError("disagg needs a split level with units on both sides (two cores at least)")
    return min(both, key=lambda i: (abs(groups[i][0] - groups[i][1]), -groups[i][0]))


class Disagg(Policy, Generic[S]):
    name = "disagg"

    def __init__(self, scheduler: Scheduler[S]) -> None:
        dev = scheduler.device
        check_disagg(dev)
        self.scheduler, self.device = scheduler, dev
        self.decode, self.prefill = scheduler.executor, scheduler.executor.twin()
        link = scheduler.link
        self.link: KvLink = VirtualLink(link) if dev.virtual else CopyLink(link, lambda: dev.pin_to_side(0))
        self.queue: deque[_Reserved] = deque()  # slots reserved, waiting for the prefill instance
        self.batch: _Batch[S] | None = None
        self.round_index = 0  # of the prefill instance's rounds

    def in_flight(self) -> bool:
        """Requests inside the pair: reserved, prefilling or on the link."""
        return bool(self.queue or self.batch is not None or self.link.queue)

    def abort(self, req: Request) -> bool:
        return (any(r.req is req for r in self.queue) or any(t.req is req for t in self.link.queue)
                or (self.batch is not None and any(r.req is req for r in self.batch.items)))

    def progress(self) -> list[PrefillProgress]:
        b = self.batch
        if b is None:
            return []
        L = self.prefill.cfg.num_layers
        done = min(L, int(L * self.device.prefill_progress()))
        return [PrefillProgress([i.req.id for i in b.items], b.tokens, done, L, 0)]  # one whole-prompt forward

    def leave(self) -> None:
        self.device.set_instances(1)

    def close(self) -> None:
        self.link.close()

    def step(self, stats: RoundStats) -> None:
        s = self.scheduler
        self._enter()
        if not s.draining:
            self._reserve()  # decode reserves the slots first
        self._start_prefill()
        stats.split = self.device.split
        if s.running:
            s.decode(stats, whole=False)
        else:
            self._wait()
        self._collect(stats, block=not s.running and not self.link.queue)  # its work goes in the prefill round
        for t in self._arrived(stats):  # KV in the decode pool: the request joins decode
            s.join_decode([t.req], [t.first_token], stats, at=t.end)
        stats.instance, stats.disagg = "decode", self.state(len(s.waiting))

    def _enter(self) -> None:
        """The policy starts (or goes on): two instances on the device."""
        dev = self.device
        if dev.instances != 2:
            dev.set_instances(2)
        if not dev.virtual and not dev.prefill_busy():
            level = even_level(dev.groups)
            if level != dev.level:
                dev.set_level(level)

    def _reserve(self) -> None:
        """The decode instance reserves slots for waiting requests, FIFO, while they fit (SGLang's
        handshake: decode prepares the destination before prefill computes)."""
        s = self.scheduler
        while s.waiting:
            req = s.waiting[0]
            table = BlockTable()
            try:
                self.decode.pool.admit(table, req.prompt_len, req.params.max_tokens, f"request {req.id}")
            except KVCapacityError:
                return  # waits for decode requests to finish
            except EngineError as exc:
                s.waiting.popleft()
                s.waiting_tokens -= req.prompt_len
                s.reject(req, str(exc))
                continue
            s.waiting.popleft()
            s.waiting_tokens -= req.prompt_len
            self.queue.append(_Reserved(req, table, self.device.now()))

    def _start_prefill(self) -> None:
        """The prefill instance takes reserved requests into one batch, if it is idle."""
        if self.batch is not None or not self.queue:
            return
        items: list[_Reserved] = []
        total = 0
        while self.queue:
            item = self.queue[0]
            n = item.req.prompt_len
            if items and total + n > self.scheduler.max_prefill_tokens:
                break
            try:
                self.prefill.admit(item.req, promise=False)
            except KVCapacityError:
                break
            except EngineError as exc:  # the model cannot take it: its reservation goes back
                self.queue.popleft()
                self.decode.pool.release(item.table)
                self.scheduler.reject(item.req, str(exc))
                continue
            self.queue.popleft()
            item.req.status = RequestStatus.PREFILLING
            items.append(item)
            total += n
        if not items:
            return
        reqs = [i.req for i in items]
        state = self.prefill.prefill_begin(reqs)
        work: Work[object] = self.prefill.prefill_work(state, reqs, 0, self.prefill.cfg.num_layers)
        self.device.submit_prefill(work)
        self.batch = _Batch(items, state, work, total, self.device.now())

    def _collect(self, stats: RoundStats, block: bool = False) -> None:
        """A finished prefill batch's requests onto the link (first tokens sampled), and its round."""
        b = self.batch
        if b is None or not self.device.collect_prefill(1, block):
            return
        self.batch = None
        ended = self.device.prefill_ended()
        per_token = self.decode.cfg.kv_bytes_per_token(self.decode.dtype_bytes)
        for item, token in zip(b.items, self.prefill.prefill_finish(b.state), strict=True):
            req, n = item.req, item.req.prompt_len
            t = Transfer(req, token, item.table, n * per_token, item.at, ended)
            self.link.send(t, functools.partial(self.decode.copy_kv_from, self.prefill, req.table, item.table, n))
        stats.side.append(self._round(b, ended))

    def _round(self, b: _Batch[S], ended: float) -> RoundRecord:
        """The prefill instance's round: one whole-prompt batch, priced on its own units and pool (its
        first tokens are counted where they are appended, in the decode instance's round)."""
        dev, (used, capacity) = self.device, self.prefill.kv_usage()
        units = dev.units if dev.virtual else dev.split[0]
        record = RoundRecord(
            index=self.round_index, time=ended, policy="disagg", level=dev.level, prefill_units=units,
            decode_units=0, pinned=False, decode_bs=0, decode_step_s=0.0, round_s=ended - b.started,
            prefills=[], tokens_emitted=0, waiting=len(self.queue), running=0, kv_used_tokens=used,
            kv_capacity_tokens=capacity, bytes_moved=b.work.bytes, flops=b.work.flops, instance="prefill",
            disagg=self.state(0))
        self.round_index += 1
        return record

    def _wait(self) -> None:
        """Nothing to decode: let time pass until a transfer or the prefill in flight ends."""
        end = self.link.next_end()
        if end is not None:
            self.device.idle(max(0.0, end - self.device.now()))
        elif self.link.queue:
            self.link.wait()
        # else: the caller blocks on the prefill (`_collect(block=True)`)

    def _arrived(self, stats: RoundStats) -> list[Transfer]:
        """Transfers ended: each request's prefill blocks freed, its decode slots now its table."""
        out = self.link.done(self.device.now())
        for t in out:
            self.prefill.free(t.req)
            t.req.table = t.table
            stats.side.append(KvTransfer(t.end, t.req.id, t.nbytes, t.reserved, t.start, t.end, self.link.name))
        return out

    def state(self, reserving: int) -> DisaggState:
        used, capacity = self.prefill.kv_usage()
        p_units = self.device.units if self.device.virtual else self.device.split[0]
        return DisaggState(reserving, len(self.queue), len(self.batch.items) if self.batch else 0, used, capacity,
                           len(self.link.queue), self.link.bytes_in_flight, self.link.name, p_units, 2)
