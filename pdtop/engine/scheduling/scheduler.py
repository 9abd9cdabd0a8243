"""The scheduler round: continuous batching under one of four policies.

- `pdmux`: one decode step on the decode side while the in-flight prefill batch advances
  `k = min(L, max(1, budget // tokens))` layers on the prefill side, at most
  `max_split_forward_layers` while decode runs (all layers left when nothing decodes, but on the
  CPU); the round waits for decode only. A prompt longer than `chunked_prefill_size` is
  prefilled chunk by chunk, each chunk so (`pdmux_prefill.py`). Finished prefills join the decode
  batch. The level is chosen again (`level_rule.SloRule`: SGLang's rule, or `level_rule: slo`)
  only while the prefill side is idle (a level change syncs both sides, as SGLang's does).
- `chunked`: each step runs the decode batch plus one `chunk_size` piece of one prompt in a
  single forward on every unit.
- `prefill-first`: waiting prompts are prefilled whole, on every unit, before decode continues.
- `disagg`: a prefill and a decode instance with their own KV pools; KV moves over a link (`disagg.py`).

With greedy sampling the policies give the same tokens: only timing differs.

The scheduler is the one owner of what a token means: `append_token` (`tokens.py`) appends
it, moves the request's status along and decides "finished"; the executor only returns tokens.
`abort` ends a request early (its client left, or a stop string matched) and frees its KV; a prefill
whose requests were all aborted stops, its state dropped, at the next boundary with no slice running."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic

from pdtop.engine.devices.base import Device, Work
from pdtop.engine.errors import EngineError, KVCapacityError
from pdtop.engine.records import PrefillProgress, RequestRecord, RoundRecord
from pdtop.engine.request import Request, RequestStatus
from pdtop.engine.roofline.kv import Link
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.runtime.kv_link import CopyLink, VirtualLink
from pdtop.engine.scheduling.disagg import DisaggPair, check_disagg
from pdtop.engine.scheduling.level_rule import DecodeStepModel, SloRule, decode_context
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.pdmux_prefill import PrefillBatch, begin, between_chunks, next_slice
from pdtop.engine.scheduling.policies import check_policy
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.tokens import append_token as append_token
from pdtop.engine.scheduling.tokens import generate as generate

MAX_PREFILL_TOKENS = 8192  # prompt tokens a pdmux / prefill-first batch may gather


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


class Scheduler(Generic[S]):
    def __init__(self, device: Device, executor: Executor[S], table: SplitTable, config: PdmuxConfig,
                 policy: str = "pdmux", max_prefill_tokens: int = MAX_PREFILL_TOKENS, link: Link | None = None):
        self.device, self.executor = device, executor
        self.config = config.for_device(device.kind)
        self.policy = check_policy(policy)
        if self.policy == "disagg":
            check_disagg(device)  # ControlError: a device that cannot hold two instances
        self.table = table.realized(device.set_groups(table.groups))  # the units each level runs with
        self.max_prefill_tokens = max_prefill_tokens
        self.pinned: int | None = None
        self.levels = SloRule(DecodeStepModel(self.table.units))  # SGLang's rule unless level_rule is slo
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefill: PrefillBatch[S] | None = None
        self.chunk_req: Request | None = None
        self.pdmux_chunk: Request | None = None  # a prompt pdmux prefills chunk by chunk (`pdmux_prefill.py`)
        self.round_index = 0
        self.rejected: list[Request] = []  # reported as "finish" records by the next step
        self.waiting_tokens = 0  # prompt tokens in `waiting` (the engine's admission cap reads it)
        self._ending: dict[int, str] = {}  # request id -> finish reason: aborted while its prefill is in flight
        self.link = link  # disagg's KV link (None: sim rdma400, cpu unpaced copies)
        self.pair: DisaggPair[S] | None = None  # disagg's two instances, made when first used
        self.next_policy: str | None = None  # a switch waiting for the prefill in flight: disagg takes no more

    # -- requests --------------------------------------------------------------------------
    def add(self, req: Request) -> RequestRecord:
        self.waiting.append(req)
        self.waiting_tokens += req.prompt_len
        return RequestRecord("arrival", req.id, req.arrival, req.prompt_len, source=req.source)

    def abort(self, req: Request, reason: str) -> RequestRecord | None:
        """End `req` now with `reason` ("abort", "stop"): out of the queue or the batch, its KV freed;
        its finish record. None when it is already finished, or when its prefill is in flight: then
        it ends when that prefill completes, or stops (`_collect_prefill`) once all its requests are aborted."""
        if req.finished:
            return None
        if (self.prefill is not None and req in self.prefill.reqs) or (self.pair and self.pair.holds(req)):
            self._ending[req.id] = reason
            return None
        if req is self.chunk_req:
            self.chunk_req = None
        elif req is self.pdmux_chunk:  # between two of its chunks
            self.pdmux_chunk = None
        elif req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self.waiting_tokens -= req.prompt_len
        return self._end(req, reason, self.device.now())

    def _end(self, req: Request, reason: str, now: float) -> RequestRecord:
        """Finish `req` early (not through `append_token`): status, reason, KV released; its finish record."""
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self.executor.free(req)
        return self._finish_record(req, now)

    @staticmethod
    def _finish_record(req: Request, now: float) -> RequestRecord:
        return RequestRecord("finish", req.id, now, req.prompt_len, len(req.output_ids), req.ttft, req.itls,
                             req.finish_reason, req.source)

    @property
    def num_layers(self) -> int:
        return self.executor.cfg.num_layers

    @property
    def prefill_in_flight(self) -> bool:
        return (self.prefill is not None or self.chunk_req is not None or self.pdmux_chunk is not None
                or (self.pair is not None and self.pair.busy()))

    def idle(self) -> bool:
        return not (self.waiting or self.running or self.prefill_in_flight)

    def _admit(self, limit_tokens: int | None) -> list[Request]:
        """Take waiting requests FIFO while the batch fits `limit_tokens` and the executor admits them
        (KV for the prompt, and the promise of room for max_tokens); they start prefilling."""
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
                req.status, req.finish_reason, req.error = RequestStatus.FINISHED, "rejected", str(exc)
                self.rejected.append(req)
                continue
            self.waiting.popleft()
            self.waiting_tokens -= req.prompt_len
            req.status = RequestStatus.PREFILLING
            batch.append(req)
            total += req.prompt_len
            if limit_tokens is None:
                break
        return batch

    def _append_token(self, req: Request, token: int, now: float, stats: RoundStats) -> None:
        """Append one sampled token (`append_token`) and count it in `stats`, with the request's first-token
        record and, when it finishes, its finish record (its KV released)."""
        finished = append_token(req, token, now, self.executor.cfg.eos_ids)
        stats.tokens += 1
        if len(req.output_ids) == 1:
            stats.requests.append(RequestRecord("first_token", req.id, now, req.prompt_len, 1, req.ttft,
                                                source=req.source))
        if finished:
            self.executor.free(req)
            stats.requests.append(self._finish_record(req, now))

    def _join_decode(self, reqs: list[Request], tokens: list[int], stats: RoundStats, at: float | None = None) -> None:
        now = self.device.now() if at is None else at
        for req, tok in zip(reqs, tokens, strict=True):
            self._append_token(req, tok, now, stats)
            reason = self._ending.pop(req.id, None)
            if reason is not None and not req.finished:  # aborted while its prefill was in flight
                stats.requests.append(self._end(req, reason, now))
            if not req.finished:
                self.running.append(req)

    def _decode(self, stats: RoundStats, whole: bool) -> None:
        batch = list(self.running)
        work = self.executor.decode_work(batch)
        t0 = self.device.now()
        tokens = self.device.run_whole(work) if whole else self.device.run_decode(work)
        now = self.device.now()
        stats.decode_s, stats.decode_bs = now - t0, len(batch)
        stats.flops += work.flops
        stats.bytes += work.bytes
        for req, tok in zip(batch, tokens, strict=True):
            self._append_token(req, tok, now, stats)
        self.running = [r for r in self.running if not r.finished]

    # -- policies --------------------------------------------------------------------------
    def _set_level(self, level: int) -> None:
        if level != self.device.level:
            self.device.set_level(level)

    @staticmethod
    def _charge(stats: RoundStats, work: Work, fraction: float) -> None:
        stats.flops += fraction * work.flops
        stats.bytes += fraction * work.bytes

    def _charge_prefill(self, stats: RoundStats) -> None:
        """Charge this round the part of a lone slice in flight done since the last charge, by the
        device's progress: a slice's cost is spread over the rounds it runs in. (With several in
        flight, each is charged whole when it is collected.)"""
        pf = self.prefill
        if pf is None or len(pf.in_flight) != 1:
            return
        done = self.device.prefill_progress()
        self._charge(stats, pf.in_flight[0][1], done - pf.charged)
        pf.charged = done

    def _collect_prefill(self, stats: RoundStats, block: bool = False) -> None:
        """Take finished prefill slices; `block` waits for them (a round with nothing to decode)."""
        pf = self.prefill
        if pf is None:
            return
        for _ in range(self.device.collect_prefill(len(pf.in_flight), block) if pf.in_flight else 0):
            pf.layers_done, work = pf.in_flight.popleft()
            self._charge(stats, work, 1.0 - pf.charged)
            pf.charged = 0.0
        if pf.layers_done == self.num_layers:
            self.prefill = None
            tokens = self.executor.prefill_finish(pf.state)
            if tokens or not pf.reqs:
                self.pdmux_chunk = None
                self._join_decode(pf.reqs, tokens, stats)
            elif (reason := self._ending.pop(pf.reqs[0].id, None)) is not None:  # aborted during a chunk
                self.pdmux_chunk = None
                stats.requests.append(self._end(pf.reqs[0], reason, self.device.now()))
        elif not pf.in_flight and all(r.id in self._ending for r in pf.reqs):  # all its clients left:
            self.prefill, self.pdmux_chunk, now = None, None, self.device.now()  # no more of it runs, KV freed
            self.executor.prefill_drop(pf.state)
            stats.requests += [self._end(r, self._ending.pop(r.id), now) for r in pf.reqs]

    def _step_pdmux(self, stats: RoundStats) -> None:
        self._collect_prefill(stats)  # a real device's chunk may have finished between rounds
        size = self.config.chunked_prefill_size
        if self.prefill is None and (self.pdmux_chunk is not None or self.waiting):
            # a chunked prompt's next chunk first (SGLang: its chunked request), else new prompts
            reqs = [self.pdmux_chunk] if self.pdmux_chunk else self._admit(min(self.max_prefill_tokens, size or
                                                                              self.max_prefill_tokens))
            if reqs:
                self.prefill = begin(self.executor, reqs, self.num_layers, self.config.token_budget, size)
                self.pdmux_chunk = reqs[0] if self.prefill.span is not None else None
        if not self.device.prefill_busy():
            level = self.pinned if self.pinned is not None else self.levels.choose(
                self.table, len(self.running), self.prefill is not None, self.config, decode_context(self.running))
            self._set_level(level)
        pf = self.prefill
        # A slice every round while the device takes more (SGLang launches one per loop iteration;
        # CUDA queues up to two, so the prefill SMs never wait for the next round to get work).
        if pf is not None and pf.submitted_end < self.num_layers and (
                not self.device.prefill_busy() or len(pf.in_flight) < self.device.max_prefill_in_flight):
            k = next_slice(pf, self.num_layers, self.config.max_split_forward_layers, bool(self.running),
                           whole_alone=self.device.kind != "cpu")  # SGLang's; the SLO rule may take more
            pf.layers_per_round = self.levels.slice_layers(k, pf.submitted_end, self.num_layers, self.config)
            end = min(self.num_layers, pf.submitted_end + pf.layers_per_round)
            work = self.executor.prefill_work(pf.state, pf.reqs, pf.submitted_end, end, pf.span)
            self.device.submit_prefill(work)
            pf.submitted_end = end
            pf.in_flight.append((end, work))
        stats.split = self.device.split
        if self.running:
            self._decode(stats, whole=False)
        self._collect_prefill(stats, block=not self.running)
        self._charge_prefill(stats)

    def _step_prefill_first(self, stats: RoundStats) -> None:
        n = len(self.device.groups)
        reqs = self._admit(self.max_prefill_tokens) if self.waiting else []
        if reqs:
            self._set_level(0 if self.pinned is None else self.pinned)
            stats.split = (self.device.units, 0)
            state = self.executor.prefill_begin(reqs)
            work = self.executor.prefill_work(state, reqs, 0, self.num_layers)
            stats.flops += work.flops
            stats.bytes += work.bytes
            self.device.run_whole(work)
            self._join_decode(reqs, self.executor.prefill_finish(state), stats)
        elif self.running:
            self._set_level(n - 1 if self.pinned is None else self.pinned)
            stats.split = (0, self.device.units)
            self._decode(stats, whole=True)

    def _step_chunked(self, stats: RoundStats) -> None:
        if self.chunk_req is None and self.waiting:
            reqs = self._admit(None)
            if reqs:
                self.chunk_req = reqs[0]
        req = self.chunk_req
        if req is None and not self.running:
            return
        n = min(self.config.chunk_size, req.prompt_len - req.num_cached) if req else 0
        batch = list(self.running)
        work = self.executor.chunk_work(batch, req, n)
        stats.split = (self.device.units, self.device.units)
        t0 = self.device.now()
        tokens, first = self.device.run_whole(work)
        now = self.device.now()
        stats.flops += work.flops
        stats.bytes += work.bytes
        if batch:
            stats.decode_s, stats.decode_bs = now - t0, len(batch)
        for r, tok in zip(batch, tokens, strict=True):
            self._append_token(r, tok, now, stats)
        self.running = [r for r in self.running if not r.finished]
        if req is not None and first is not None:  # this chunk ended req's prompt
            self.chunk_req = None
            self._join_decode([req], [first], stats)

    def _step_disagg(self, stats: RoundStats) -> None:
        if self.pair is None:
            dev = self.device
            link = VirtualLink(self.link) if dev.virtual else CopyLink(self.link, lambda: dev.pin_to_side(0))
            self.pair = DisaggPair(self.device, self.executor, self.executor.twin(), link, self.max_prefill_tokens)
        pair = self.pair
        pair.enter()
        pair.reserve(self, take=self.next_policy is None)  # decode reserves the slots first
        pair.start_prefill(self)
        stats.split = self.device.split
        if self.running:
            self._decode(stats, whole=False)
        else:
            pair.wait()
        pair.collect(block=not self.running and not pair.link.queue)  # its work goes in the prefill round
        for t in pair.arrived():  # KV in the decode pool: the request joins decode
            self._join_decode([t.req], [t.first_token], stats, at=t.end)

    # -- the round -------------------------------------------------------------------------
    def step(self) -> tuple[RoundRecord, list[RequestRecord]]:
        t0 = self.device.now()
        stats = RoundStats()
        if self.policy == "pdmux":
            self._step_pdmux(stats)
        elif self.policy == "chunked":
            self._step_chunked(stats)
        elif self.policy == "disagg":
            self._step_disagg(stats)
        else:
            self._step_prefill_first(stats)
        now = self.device.now()
        for req in self.rejected:
            stats.requests.append(self._finish_record(req, now))
        self.rejected.clear()
        p_units, d_units = stats.split if stats.split is not None else self.device.split
        used, capacity = self.executor.kv_usage()
        record = RoundRecord(
            index=self.round_index, time=now, policy=self.policy, level=self.device.level,
            prefill_units=p_units, decode_units=d_units, pinned=self.pinned is not None,
            decode_bs=stats.decode_bs, decode_step_s=stats.decode_s, round_s=now - t0,
            prefills=self._progress(), tokens_emitted=stats.tokens, waiting=len(self.waiting),
            running=len(self.running), kv_used_tokens=used, kv_capacity_tokens=capacity,
            bytes_moved=stats.bytes, flops=stats.flops, instance="decode" if self.policy == "disagg" else None,
            disagg=self.pair.state(len(self.waiting)) if self.pair and self.policy == "disagg" else None)
        self.round_index += 1
        return record, stats.requests

    def _progress(self) -> list[PrefillProgress]:
        if self.pair is not None and self.policy == "disagg":
            return self.pair.progress()
        L = self.num_layers
        if self.prefill is not None:
            return [self.prefill.progress(L)]
        if self.pdmux_chunk is not None:
            return [between_chunks(self.pdmux_chunk, L, self.config.chunked_prefill_size, self.config.token_budget)]
        if self.chunk_req is not None:
            r = self.chunk_req
            return [PrefillProgress([r.id], r.prompt_len, L * r.num_cached // r.prompt_len, L, 0, r.num_cached)]
        return []

    # -- changes at a round boundary (the engine's control goes through these) ---------------
    def pin_level(self, level: int | None) -> None:
        """Pin a level (an index into the table), or None: back to automatic choice."""
        if level is not None and not 0 <= level < len(self.table.groups):
            raise ValueError(f"level {level} out of range 0..{len(self.table.groups) - 1}")
        self.pinned = level

    def set_policy(self, policy: str) -> None:
        """Switch policy (ConfigError if unknown); refused (ValueError) while a prefill is in flight,
        which the old policy owns."""
        check_policy(policy)
        if policy != self.policy and self.prefill_in_flight:
            raise ValueError("a prefill is in flight: switch policy once it is done")
        self.policy, self.next_policy = policy, None
        if policy != "disagg":
            self.device.set_instances(1)

    def set_config(self, config: PdmuxConfig, table: SplitTable | None = None) -> None:
        """New knobs, and new levels when manual divisions or sm_group_num changed; with new levels
        the level is chosen again next round (a pin past the last level is dropped)."""
        if table is not None:
            self.table = table.realized(self.device.set_groups(table.groups))
            if self.pinned is not None and self.pinned >= len(self.table.groups):
                self.pinned = None
        self.config = config.for_device(self.device.kind)
