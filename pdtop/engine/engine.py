"""The engine: scheduler + workload + live control, reporting every round to its sinks.

One thread runs the rounds (`run`). `control` may be called from any thread: it
validates at once against the state the change will meet (the changes queued before it
included; ControlError, nothing changed) and queues the change, which is applied at the
next round boundary and reported as a `ConfigChange`. Applying checks it again: a change
that fails there is reported as a `ControlFailure`, and the rounds go on.

Requests: `submit` adds one at once, on the engine's thread (the workload, benchmarks,
tests). From any other thread (the HTTP API), `enqueue` queues one for the next round
boundary and streams its tokens back through a callback, and `abort` ends one there.
Both refuse work over the waiting-queue caps (`QueueLimits`) with `QueueFullError`,
and every refusal is reported as a request that arrived and finished "rejected".
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pdtop.engine.description import EngineConfig, EngineDescription, Limits, Totals
from pdtop.engine.devices.base import Device
from pdtop.engine.errors import ControlError, EngineError, FieldError, PromptError, QueueFullError
from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.engine.request import SOURCES, Request, SamplingParams
from pdtop.engine.runtime.executor import Executor
from pdtop.engine.runtime.heap import freeze_startup_heap
from pdtop.engine.scheduling.admission import QueueLimits
from pdtop.engine.scheduling.control import Change, ControlFailure, Plan, subject, validate
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.scheduler import Scheduler
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.workload import LONG_PROMPT_TOKENS, Arrival, PromptMaker, Workload
from pdtop.engine.sinks import Record, Sink, Sinks
from pdtop.engine.updates import OnUpdate, Watchers

IDLE_S = 0.05  # how long an idle round waits for arrivals (a real device wakes early when a request comes)
MAX_REFUSALS_HELD = 4096  # refusals reported per round boundary at most; the counts in describe() keep the rest

log = logging.getLogger("pdtop.engine")


class Engine:
    def __init__(self, *, device: Device, executor: Executor, table: SplitTable, config: PdmuxConfig,
                 policy: str, workload: Workload | None, prompts: PromptMaker, model_name: str,
                 temperature: float = 0.0, seed: int = 0, limits: QueueLimits | None = None, tokenizer: Any = None):
        self.device, self.executor, self.model_name = device, executor, model_name
        self.scheduler = Scheduler(device, executor, table, config, policy)
        self.workload = workload
        self.prompts = prompts
        self.tokenizer = tokenizer  # the model file's `Tokenizer`; None for synthetic models
        self.temperature, self.seed = temperature, seed
        self.limits = limits or QueueLimits()
        self.refused = dict.fromkeys(SOURCES, 0)  # requests refused over the caps, by source
        self.sinks = Sinks()
        self._pending: deque[tuple[Change, str | None]] = deque()
        self._plan: Plan | None = None  # the state once every queued change is applied; None: the current one
        self._deferred_policy: tuple[str, str | None] | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        # filled by any thread under the lock, taken at round boundaries by the engine's
        self._incoming: deque[tuple[Request, OnUpdate | None]] = deque()
        self._incoming_tokens = 0
        self._injects = [0, 0]  # injects accepted and not yet applied: [count, prompt tokens], held in the caps
        self._aborts: deque[tuple[Request, str]] = deque()
        self._refusals: deque[tuple[RequestRecord, RequestRecord]] = deque(maxlen=MAX_REFUSALS_HELD)
        self._wake = threading.Event()  # set when work comes in, so an idle round ends early
        self._watchers = Watchers()  # engine thread only
        self.totals = {"arrived": 0, "first_token": 0, "finished": 0, "rejected": 0}  # since the engine started
        self._open: list[tuple[Arrival, Request]] = []  # closed-loop and periodic requests not finished yet
        self._pace: Callable[[], None] = lambda: None  # set by `run` to hold a virtual clock to wall time

    # -- what clients see ------------------------------------------------------------------
    def add_sink(self, sink: Sink) -> None:
        """Call `sink(record)` on the engine thread for every record (`sinks.py` says who may add)."""
        self.sinks.add(sink)

    def remove_sink(self, sink: Sink) -> None:
        self.sinks.remove(sink)

    def _emit(self, record: Record) -> None:
        if isinstance(record, RequestRecord):
            self._count(record)
        self.sinks.emit(record)

    def _count(self, record: RequestRecord) -> None:
        if record.kind == "arrival":
            self.totals["arrived"] += 1
        elif record.kind == "first_token":
            self.totals["first_token"] += 1
        elif record.kind == "finish":
            self.totals["rejected" if record.finish_reason == "rejected" else "finished"] += 1

    @property
    def config(self) -> PdmuxConfig:
        return self.scheduler.config

    def config_record(self) -> EngineConfig:
        """The whole configuration in force: the pdmux knobs, the policy, the pin, the levels, the workload."""
        s, c, w = self.scheduler, self.config, self.workload
        return EngineConfig(
            sm_group_num=c.sm_group_num, manual_divisions=[(p, d, t) for p, d, t in c.manual_divisions],
            split_forward_token_budget=c.token_budget,  # the scheduler's config is set for its device: never None
            decode_bs_divisor=c.decode_bs_divisor, chunk_size=c.chunk_size, policy=s.policy, pinned_level=s.pinned,
            levels=[(p, d) for p, d in s.table.groups], workload_rate=w.spec.rate if w else 0.0,
            workload_paused=w.spec.paused if w else True)

    def describe(self) -> EngineDescription:
        cfg, dev = self.executor.cfg, self.device
        return EngineDescription(
            model=self.model_name, num_layers=cfg.num_layers, max_context=cfg.max_context, device=dev.describe(),
            unit_name=dev.unit_name, units=dev.units, virtual_clock=dev.virtual,
            levels=[(p, d) for p, d in self.scheduler.table.groups], config=self.config_record(),
            policy=self.scheduler.policy, runtime=self.executor.describe(),
            limits=Limits(self.limits.max_waiting_requests, self.limits.max_waiting_tokens, dict(self.refused)),
            totals=Totals(**self.totals),
            workload=self.workload.spec.describe() if self.workload else None)

    @property
    def max_prompt(self) -> int:
        return max(1, self.executor.cfg.max_context - 1)

    # -- control ---------------------------------------------------------------------------
    def control(self, msg: Any, client: str | None = None) -> None:
        """Validate now against the state it will meet (ControlError changes nothing); apply at the
        next round boundary."""
        with self._lock:
            plan = self._plan or Plan(self.config, self.scheduler.table)
            change = validate(msg, config=plan.config, table=plan.table, max_prompt=self.max_prompt)
            if change.cmd == "inject":  # its room in the queue is held until it is applied
                tokens = self._inject_tokens(change)
                try:
                    self._check_room(tokens, "inject", self.device.now())
                except QueueFullError as exc:
                    raise ControlError("inject", str(exc)) from None
                self._injects[0] += 1
                self._injects[1] += tokens
            self._pending.append((change, client))
            self._plan = plan.after(change)
        self._wake.set()

    def _apply(self, change: Change, client: str | None) -> dict[str, dict[str, Any]]:
        s, w, now = self.scheduler, self.workload, self.device.now()
        diff: dict[str, dict[str, Any]] = {}

        def note(name: str, old: Any, new: Any) -> None:
            if old != new:
                diff[name] = {"old": old, "new": new}

        if change.cmd in ("pin_level", "auto_level"):
            level = change.values["level"] if change.cmd == "pin_level" else None
            note("pinned_level", s.pinned, level)
            s.pin_level(level)
        elif change.cmd == "inject":
            tokens, max_tokens = change.values.get("prompt_tokens"), change.values.get("max_tokens")
            if w is not None:
                w.inject(now, tokens, max_tokens)
            else:
                self._arrive(Arrival(now, tokens or LONG_PROMPT_TOKENS, max_tokens or 64, "inject"))
            diff["inject"] = {"old": None, "new": tokens or "default"}
        elif change.cmd in ("pause_workload", "resume_workload") and w is not None:
            paused = change.cmd == "pause_workload"
            note("workload_paused", w.spec.paused, paused)
            w.pause() if paused else w.resume(now)
        elif change.cmd == "set":
            values = dict(change.values)
            policy, rate = values.pop("policy", None), values.pop("workload_rate", None)
            if values:  # first: new levels are what may fail (a device that cannot build them)
                old, old_levels, old_pin = s.config, [list(g) for g in s.table.groups], s.pinned
                s.set_config(change.config or old, change.table)
                for name in values:
                    note(name, getattr(old, name), getattr(s.config, name))
                if change.table is not None:
                    note("levels", old_levels, [list(g) for g in s.table.groups])  # as the device realized them
                    note("pinned_level", old_pin, s.pinned)  # a pin past the new last level is dropped
            if policy is not None:
                if s.prefill_in_flight and policy != s.policy:
                    self._deferred_policy = (policy, client)  # switched once in-flight prefill is done
                else:
                    note("policy", s.policy, policy)
                    s.set_policy(policy)
            if rate is not None and w is not None:
                note("workload_rate", w.spec.rate, rate)
                w.set_rate(rate, now)
        return diff

    def _apply_pending(self) -> None:
        s = self.scheduler
        if self._deferred_policy and not s.prefill_in_flight:
            (policy, client), self._deferred_policy = self._deferred_policy, None
            old = s.policy
            s.set_policy(policy)
            if old != policy:
                diff = {"policy": {"old": old, "new": policy}}
                self._emit(ConfigChange(self.device.now(), s.round_index, diff, client))
        while True:
            with self._lock:  # the change stays queued (and planned) until it is applied
                if not self._pending:
                    return
                queued, client = self._pending[0]
                if queued.cmd == "inject":  # the room it held goes back; it arrives through the caps
                    self._injects[0] -= 1
                    self._injects[1] -= self._inject_tokens(queued)
            try:
                change = validate(queued.msg, config=s.config, table=s.table, max_prompt=self.max_prompt)
                diff = self._apply(change, client)
            except Exception as exc:  # no control message may stop the engine
                field, reason = (exc.field, exc.reason) if isinstance(exc, FieldError) \
                    else (subject(queued.msg), str(exc))
                if not isinstance(exc, EngineError):
                    log.exception("applying %r", queued.msg)
                    reason = f"{type(exc).__name__}: {exc}"
                self._emit(ControlFailure(self.device.now(), s.round_index, field, reason, client))
                diff = {}
            with self._lock:
                self._pending.popleft()
                if not self._pending:
                    self._plan = None
            if diff:
                self._emit(ConfigChange(self.device.now(), s.round_index, diff, client))

    # -- requests --------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
               arrival: float | None = None, source: str = "workload") -> Request:
        """Add a request now: on the engine's thread, or while it is not running. QueueFullError over the caps."""
        with self._lock:
            params = SamplingParams(temperature=self.temperature, seed=self.seed + self._next_id,
                                    max_tokens=max_tokens, ignore_eos=ignore_eos)
            req = self._new_request(prompt_ids, params, source, arrival)
            record = self.scheduler.add(req)
        self._emit(record)
        return req

    def enqueue(self, prompt_ids: list[int], params: SamplingParams, *, source: str = "api",
                on_update: OnUpdate | None = None) -> Request:
        """Thread-safe: queue a request for the next round boundary (QueueFullError over the caps).

        `on_update` is called on the engine thread after each round that gave the request tokens,
        and a last time with its finish reason; it must not block. When it returns True (a stop
        string matched) the request ends there, before the next round, with finish reason "stop",
        and gets no further update.
        The returned request belongs to the engine: read nothing of it from another thread, pass
        it to `abort`."""
        with self._lock:
            req = self._new_request(prompt_ids, params, source, None)
            self._incoming.append((req, on_update))
            self._incoming_tokens += req.prompt_len
        self._wake.set()
        return req

    def abort(self, req: Request, reason: str = "abort") -> None:
        """Thread-safe: end `req` at the next round boundary with `reason` ("abort": its client left,
        "stop": a stop string matched); its KV is freed then (after its prefill, if one is in flight)."""
        with self._lock:
            self._aborts.append((req, reason))
        self._wake.set()

    def check_request(self, prompt_tokens: int, params: SamplingParams) -> None:
        """PromptError if such a request could never run here: bad sampling parameters, an empty
        prompt, prompt + max_tokens past the context, or more KV than the whole cache."""
        params.validate()
        if prompt_tokens < 1:
            raise PromptError("empty prompt: a request needs at least one token")
        context = self.executor.cfg.max_context
        if prompt_tokens + params.max_tokens > context:
            raise PromptError(f"prompt of {prompt_tokens} tokens + max_tokens {params.max_tokens} exceeds the "
                              f"model's context of {context} tokens")
        pool = self.executor.pool
        if pool.blocks_for(prompt_tokens + params.max_tokens) > pool.num_blocks:
            raise PromptError(f"KV cache too small: prompt of {prompt_tokens} tokens + max_tokens "
                              f"{params.max_tokens}; the whole cache holds {pool.capacity_tokens}")

    def _new_request(self, prompt_ids: list[int], params: SamplingParams, source: str,
                     arrival: float | None) -> Request:
        """Under the lock: a new request with the next id, if the queue has room."""
        now = self.device.now() if arrival is None else arrival
        self._check_room(len(prompt_ids), source, now)
        req = Request(self._next_id, list(prompt_ids), params, now, source=source)
        self._next_id += 1
        return req

    def _inject_tokens(self, change: Change) -> int:
        return change.values.get("prompt_tokens") or (
            self.workload.spec.long_prompt_tokens if self.workload else LONG_PROMPT_TOKENS)

    def _check_room(self, prompt_tokens: int, source: str, now: float) -> None:
        """Under the lock: QueueFullError if a request of `prompt_tokens` would pass a cap; the refusal
        is counted and reported at the next round boundary (an arrival, then a "rejected" finish)."""
        try:
            self.limits.check(len(self.scheduler.waiting) + len(self._incoming) + self._injects[0],
                              self.scheduler.waiting_tokens + self._incoming_tokens + self._injects[1],
                              prompt_tokens)
        except QueueFullError:
            rid, self._next_id = self._next_id, self._next_id + 1
            self.refused[source] += 1
            self._refusals.append((RequestRecord("arrival", rid, now, prompt_tokens, source=source),
                                   RequestRecord("finish", rid, now, prompt_tokens, finish_reason="rejected",
                                                 source=source)))
            raise

    def _arrive(self, arrival: Arrival) -> Request | None:
        cfg = self.executor.cfg
        n = max(1, min(arrival.prompt_tokens, cfg.max_context - arrival.max_tokens))
        source = "inject" if arrival.injected else "workload"
        try:
            with self._lock:  # checked before the prompt is made: a refused arrival costs no memory
                self._check_room(n, source, arrival.time)
            return self.submit(self.prompts.make(n), arrival.max_tokens, ignore_eos=True, arrival=arrival.time,
                               source=source)
        except QueueFullError:
            return None  # dropped: reported as rejected, counted in describe()["limits"]["refused"]

    def _take_arrivals(self, workload: Workload) -> None:
        """Submit what the workload has due, telling it how many of its closed-loop requests are
        still in flight and whether its last long prompt still waits for its first token."""
        self._open = [(a, r) for a, r in self._open if not r.finished]
        in_flight = sum(a.kind == "loop" for a, _ in self._open)
        long_waiting = any(a.kind == "long" and not r.output_ids for a, r in self._open)
        for arrival in workload.due(self.device.now(), in_flight, long_waiting):
            req = self._arrive(arrival)
            if req is not None and arrival.kind in ("loop", "long"):
                self._open.append((arrival, req))

    def _take_requests(self) -> None:
        """At a round boundary: queued requests join the scheduler, refusals are reported, aborts applied."""
        with self._lock:  # added under the lock, so a concurrent cap check never misses them
            added = [self.scheduler.add(req) for req, _ in self._incoming]
            for req, cb in self._incoming:
                if cb is not None:
                    self._watchers.add(req, cb)
            self._incoming.clear()
            self._incoming_tokens = 0
            refusals = list(self._refusals)
            self._refusals.clear()
            aborts = list(self._aborts)
            self._aborts.clear()
        for record in added:
            self._emit(record)
        for arrived, refused in refusals:
            self._emit(arrived)
            self._emit(refused)
        for req, reason in aborts:
            finish = self.scheduler.abort(req, reason)
            if finish is not None:
                self._emit(finish)

    def _stop(self, req: Request) -> None:
        """A caller's stop string matched: end `req` before the next round."""
        finish = self.scheduler.abort(req, "stop")
        if finish is not None:
            self._emit(finish)

    def idle(self) -> bool:
        """Nothing queued, waiting, prefilling or decoding."""
        return not self._incoming and self.scheduler.idle()

    # -- rounds ----------------------------------------------------------------------------
    def step(self) -> RoundRecord:
        self._wake.clear()
        self._apply_pending()
        if self.workload is not None:
            self._take_arrivals(self.workload)
        self._take_requests()
        if self.scheduler.idle():
            if self.device.virtual:
                self.device.idle(IDLE_S)
            else:
                self._wake.wait(IDLE_S)
                self._take_requests()
        record, requests = self.scheduler.step()
        self._pace()  # a paced virtual clock: report the round when wall time reaches its end
        for r in requests:
            self._emit(r)
        self._emit(record)
        if self._watchers:
            self._watchers.notify(self._stop)
        return record

    def run(self, stop: threading.Event, realtime: bool = True, speed: float = 1.0) -> None:
        """Run rounds until `stop` is set. A virtual clock is paced to wall time x `speed` when
        `realtime` (speed 0.1: ten wall seconds per simulated second)."""
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        freeze_startup_heap()
        if realtime and self.device.virtual:
            wall0, clock0 = time.perf_counter(), self.device.now()

            def pace() -> None:
                ahead = (self.device.now() - clock0) / speed - (time.perf_counter() - wall0)
                if ahead > 0:
                    stop.wait(ahead)

            self._pace = pace
        try:
            while not stop.is_set():
                self.step()
        finally:
            self._pace = lambda: None

    def run_until_idle(self, max_rounds: int = 1_000_000) -> int:
        """Run rounds until every submitted request has finished (no workload arrivals)."""
        n = 0
        while not self.idle() and n < max_rounds:
            self.step()
            n += 1
        return n

    def close(self) -> None:
        self.device.close()
