"""The scheduler round: continuous batching under one policy at a time (`Policy`, `policy.py`).

The scheduler keeps what every policy shares: the waiting queue and admission (KV through the
executor), the decode batch and its step, the one place a token is appended (`append`, through
`tokens.append_token`, which moves the request's status along and decides "finished"; the
executor only returns tokens), how a request ends early (`abort`: its client left, or a stop
string matched; its KV freed), and the round's record. The policy decides what prefill work runs
beside decode and holds the requests it is prefilling:

- `pdmux` (`pdmux.py`): decode on its own units while the prefill advances layer by layer beside it;
- `chunked` (`chunked.py`): the decode batch plus one piece of one prompt in one forward on every unit;
- `prefill-first` (`prefill_first.py`): waiting prompts prefilled whole before decode continues;
- `disagg` (`disagg.py`): a prefill and a decode instance with their own KV pools, KV over a link.

With greedy sampling the policies give the same tokens: only timing differs. `switch` swaps the
policy at a round boundary once the old one has nothing in flight (`draining` asks it to take no
new request meanwhile); each policy is made once and kept, so disagg's second instance is too.
"""
from __future__ import annotations

from collections import deque
from typing import Generic

from pdtop.engine.devices.base import Device
from pdtop.engine.errors import EngineError, KVCapacityError
from pdtop.engine.records import KvTransfer, RequestRecord, RoundRecord
from pdtop.engine.request import Request, RequestStatus
from pdtop.engine.roofline.kv import Link
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.scheduling.chunked import Chunked
from pdtop.engine.scheduling.disagg import Disagg
from pdtop.engine.scheduling.level_rule import DecodeStepModel, SloRule
from pdtop.engine.scheduling.pdmux import Pdmux
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.policies import check_policy
from pdtop.engine.scheduling.policy import Policy, RoundStats
from pdtop.engine.scheduling.prefill_first import PrefillFirst
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.tokens import append_token

MAX_PREFILL_TOKENS = 8192  # prompt tokens a pdmux / prefill-first batch may gather


class Scheduler(Generic[S]):
    def __init__(self, device: Device, executor: Executor[S], table: SplitTable, config: PdmuxConfig,
                 policy: str = "pdmux", max_prefill_tokens: int = MAX_PREFILL_TOKENS, link: Link | None = None):
        self.device, self.executor = device, executor
        self.config = config.for_device(device.kind)
        self.table = table.realized(device.set_groups(table.groups))  # the units each level runs with
        self.max_prefill_tokens = max_prefill_tokens
        self.pinned: int | None = None
        self.levels = SloRule(DecodeStepModel(self.table.units))  # SGLang's rule unless level_rule is slo
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.round_index = 0
        self.rejected: list[Request] = []  # reported as "finish" records by the next step
        self.waiting_tokens = 0  # prompt tokens in `waiting` (the engine's admission cap reads it)
        self.ending: dict[int, str] = {}  # request id -> finish reason: aborted while its policy has it in flight
        self.link = link  # disagg's KV link (None: sim rdma400, cpu unpaced copies)
        self.draining = False  # a policy switch waits for the active policy's work in flight: it takes no more
        self.made: dict[str, Policy] = {}  # the policies made so far, by name
        self.active: Policy = self.get(check_policy(policy))

    def get(self, name: str) -> Policy:
        """`name`'s policy (a name `check_policy` passed), made the first time it is asked for (disagg's
        makes its second instance then, which may fail)."""
        if name not in self.made:
            policy: Policy
            match name:
                case "pdmux":
                    policy = Pdmux(self)
                case "chunked":
                    policy = Chunked(self)
                case "prefill-first":
                    policy = PrefillFirst(self)
                case _:
                    policy = Disagg(self)
            self.made[name] = policy
        return self.made[name]

    @property
    def policy(self) -> str:
        return self.active.name

    @property
    def num_layers(self) -> int:
        return self.executor.cfg.num_layers

    @property
    def prefill_in_flight(self) -> bool:
        return self.active.in_flight()

    def idle(self) -> bool:
        return not (self.waiting or self.running or self.active.in_flight())

    # -- requests --------------------------------------------------------------------------
    def add(self, req: Request) -> RequestRecord:
        self.waiting.append(req)
        self.waiting_tokens += req.prompt_len
        return RequestRecord("arrival", req.id, req.arrival, req.prompt_len, source=req.source)

    def abort(self, req: Request, reason: str) -> RequestRecord | None:
        """End `req` now with `reason` ("abort", "stop"): out of the queue or the batch, its KV freed;
        its finish record. None when it is already finished, or when its policy has its work in flight:
        then it ends when that work is done (`Policy.abort`)."""
        if req.finished:
            return None
        if self.active.abort(req):
            self.ending[req.id] = reason
            return None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self.waiting_tokens -= req.prompt_len
        return self.end(req, reason, self.device.now())

    def end(self, req: Request, reason: str, now: float) -> RequestRecord:
        """Finish `req` early (not through `append_token`): status, reason, KV released; its finish record."""
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self.executor.free(req)
        return _finish_record(req, now)

    def reject(self, req: Request, why: str) -> None:
        req.status, req.finish_reason, req.error = RequestStatus.FINISHED, "rejected", why
        self.rejected.append(req)

    def admit(self, limit_tokens: int | None) -> list[Request]:
        """Take waiting requests FIFO while the batch fits `limit_tokens` (None: one) and the executor
        admits them (KV for the prompt, and the promise of room for max_tokens); they start prefilling."""
        batch: list[Request] = []
        total = 0
        while self.waiting:
            req = self.waiting[0]
            if batch and limit_tokens is not None and total + req.prompt_len > limit_tokens:
                break
            try:
                self.executor.admit(req)
            except KVCapacityError:
                break  # waits until running requests finish and free their KV
            except EngineError as exc:  # a request the model cannot take: it ends here, the rest go on
                self.waiting.popleft()
                self.waiting_tokens -= req.prompt_len
                self.reject(req, str(exc))
                continue
            self.waiting.popleft()
            self.waiting_tokens -= req.prompt_len
            req.status = RequestStatus.PREFILLING
            batch.append(req)
            total += req.prompt_len
            if limit_tokens is None:
                break
        return batch

    # -- tokens and the decode batch --------------------------------------------------------
    def append(self, req: Request, token: int, now: float, stats: RoundStats) -> None:
        """Append one sampled token (`append_token`) and count it in `stats`, with the request's first-token
        record and, when it finishes, its finish record (its KV released)."""
        finished = append_token(req, token, now, self.executor.cfg.eos_ids)
        stats.tokens += 1
        if len(req.output_ids) == 1:
            stats.requests.append(RequestRecord("first_token", req.id, now, req.prompt_len, 1, req.ttft,
                                                source=req.source))
        if finished:
            self.executor.free(req)
            stats.requests.append(_finish_record(req, now))

    def join_decode(self, reqs: list[Request], tokens: list[int], stats: RoundStats, at: float | None = None) -> None:
        now = self.device.now() if at is None else at
        for req, tok in zip(reqs, tokens, strict=True):
            self.append(req, tok, now, stats)
            reason = self.ending.pop(req.id, None)
            if reason is not None and not req.finished:  # aborted while its prefill was in flight
                stats.requests.append(self.end(req, reason, now))
            if not req.finished:
                self.running.append(req)

    def decode(self, stats: RoundStats, whole: bool) -> None:
        batch = list(self.running)
        work = self.executor.decode_work(batch)
        t0 = self.device.now()
        tokens = self.device.run_whole(work) if whole else self.device.run_decode(work)
        now = self.device.now()
        stats.decode_s, stats.decode_bs = now - t0, len(batch)
        stats.charge(work)
        for req, tok in zip(batch, tokens, strict=True):
            self.append(req, tok, now, stats)
        self.running = [r for r in self.running if not r.finished]

    def set_level(self, level: int) -> None:
        if level != self.device.level:
            self.device.set_level(level)

    # -- the round -------------------------------------------------------------------------
    def step(self) -> tuple[RoundRecord, list[RequestRecord | RoundRecord | KvTransfer]]:
        """One round: its record, and the records it made before it (requests; under disagg the prefill
        instance's rounds and KV transfers, in time order)."""
        t0 = self.device.now()
        stats = RoundStats()
        self.active.step(stats)
        now = self.device.now()
        for req in self.rejected:
            stats.requests.append(_finish_record(req, now))
        self.rejected.clear()
        p_units, d_units = stats.split if stats.split is not None else self.device.split
        used, capacity = self.executor.kv_usage()
        record = RoundRecord(
            index=self.round_index, time=now, policy=self.policy, level=self.device.level,
            prefill_units=p_units, decode_units=d_units, pinned=self.pinned is not None,
            decode_bs=stats.decode_bs, decode_step_s=stats.decode_s, round_s=now - t0,
            prefills=self.active.progress(), tokens_emitted=stats.tokens, waiting=len(self.waiting),
            running=len(self.running), kv_used_tokens=used, kv_capacity_tokens=capacity,
            bytes_moved=stats.bytes, flops=stats.flops, instance=stats.instance, disagg=stats.disagg)
        self.round_index += 1
        return record, [*stats.requests, *sorted(stats.side, key=lambda r: r.time)]

    # -- changes at a round boundary (the engine's control checks them first) ------------------
    def pin_level(self, level: int | None) -> None:
        """Pin a level (an index into the table), or None: back to automatic choice."""
        self.pinned = level

    def switch(self, policy: str) -> None:
        """Swap the active policy for `policy`'s (made the first time). Only at a boundary where the
        active one has nothing in flight: its requests are its own."""
        if self.active.in_flight():
            raise ValueError(f"switching from {self.policy} while it has a prefill in flight")
        new = self.get(check_policy(policy))
        if new is not self.active:
            self.active.leave()
            self.active = new
        self.draining = False

    def set_config(self, config: PdmuxConfig, table: SplitTable | None = None) -> None:
        """New knobs, and new levels when manual divisions or sm_group_num changed; with new levels
        the level is chosen again next round (a pin past the last level is dropped)."""
        if table is not None:
            self.table = table.realized(self.device.set_groups(table.groups))
            if self.pinned is not None and self.pinned >= len(self.table.groups):
                self.pinned = None
        self.config = config.for_device(self.device.kind)

    def close(self) -> None:
        for policy in self.made.values():
            policy.close()


def _finish_record(req: Request, now: float) -> RequestRecord:
    return RequestRecord("finish", req.id, now, req.prompt_len, len(req.output_ids), req.ttft, req.itls,
                         req.finish_reason, req.source)
