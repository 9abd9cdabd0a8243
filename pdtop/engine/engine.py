"""The engine: scheduler + workload + live control, reporting every round to its sinks.

One thread runs the rounds (`run`). `control` may be called from any thread with a command
(`pdtop.engine.scheduling.commands`); it returns a future at once. At the next round boundary
the engine's thread checks the command, once, against the state it meets, and applies it: the
future resolves with the typed `Change` (`control.py`), reported to the sinks as a
`ConfigChange` when anything changed, or with `ControlError`, nothing changed; the rounds go on
either way. Commands apply in order. A policy switch asked while the old policy has a prefill
in flight waits, first in the queue with the commands after it, until the first boundary with
nothing in flight: meanwhile the old policy takes no new request (its prefill runs to its end).

Requests: `submit` adds one at once, on the engine's thread (the workload, benchmarks,
tests). From any other thread (the HTTP API), `enqueue` queues one for the next round
boundary and streams its tokens back through a callback, and `abort` ends one there.
Both refuse work over the waiting-queue caps with `QueueFullError` (`Intake`), and every
refusal is reported as a request that arrived and finished "rejected".
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Generic

from pdtop.engine.control import Change, ControlQueue, Settings, resolve
from pdtop.engine.description import EngineConfig, EngineDescription, Limits, Totals
from pdtop.engine.devices.base import Device
from pdtop.engine.errors import ControlError, EngineError, FieldError, QueueFullError
from pdtop.engine.intake import Intake
from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.roofline.kv import Link
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.runtime.heap import freeze_startup_heap
from pdtop.engine.scheduling.admission import QueueLimits
from pdtop.engine.scheduling.commands import (
    AutoLevel,
    EngineCommand,
    Inject,
    PauseWorkload,
    PinLevel,
    ResumeWorkload,
    Set,
)
from pdtop.engine.scheduling.disagg import check_disagg
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, in_range
from pdtop.engine.scheduling.scheduler import Scheduler
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.workload import LONG_PROMPT_TOKENS, Arrival, PromptMaker, Workload
from pdtop.engine.sinks import Record, Sink, Sinks
from pdtop.engine.updates import OnUpdate, Watchers

if TYPE_CHECKING:
    from pdtop.engine.model.tokenizer import Tokenizer

IDLE_S = 0.05  # how long an idle round waits for arrivals (a real device wakes early when a request comes)
INJECT_MAX_TOKENS = 64  # an injected request's output when the command gives none and no workload runs
REBUILD = frozenset(("manual_divisions", "sm_group_num", "overlap_decode_full_sm"))  # knobs that make new levels

log = logging.getLogger("pdtop.engine")


class Engine(Generic[S]):
    """`S`: the executor's in-flight prefill state (the model runner's, or the simulator's)."""

    def __init__(self, *, device: Device, executor: Executor[S], table: SplitTable, config: PdmuxConfig,
                 policy: str, workload: Workload | None, prompts: PromptMaker, model_name: str,
                 model_path: str | None = None, temperature: float = 0.0, seed: int = 0,
                 limits: QueueLimits | None = None, tokenizer: Tokenizer | None = None, link: Link | None = None):
        self.device, self.executor, self.model_name = device, executor, model_name
        self.model_path = model_path or model_name  # what it was loaded from: a GGUF file, `synthetic:NAME`
        self.scheduler = Scheduler(device, executor, table, config, policy, link=link)
        self.workload = workload
        self.prompts = prompts
        self.tokenizer = tokenizer  # the model file's; None for synthetic models
        self.limits = limits or QueueLimits()
        self.intake = Intake(self.scheduler, self.limits, temperature=temperature, seed=seed)
        self.controls = ControlQueue()
        self.sinks = Sinks()
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

    def _report(self, record: Record) -> None:
        """Hand `record` to every sink (request records are counted in `totals` first)."""
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
    def refused(self) -> dict[str, int]:
        """Requests refused over the caps since the engine started, by source."""
        return self.intake.refused

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
            workload_paused=w.spec.paused if w else True, max_split_forward_layers=c.max_split_forward_layers or None,
            overlap_decode_full_sm=c.overlap_decode_full_sm or None, level_rule=c.level_rule, slo_itl_ms=c.slo_itl_ms,
            chunked_prefill_size=c.chunked_prefill_size or None)

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
    def control(self, command: EngineCommand, client: str | None = None) -> Future[Change]:
        """Queue `command` for the next round boundary (any thread); the future resolves there with the
        `Change` it made, or with `ControlError` (nothing changed). `client` names who asked, in the
        `ConfigChange` it gives."""
        future = self.controls.put(command, client)
        self.intake.wake.set()
        return future

    def settings(self) -> Settings:
        """What control commands change, as it is now."""
        s, w = self.scheduler, self.workload
        return Settings(s.config, tuple((p, d) for p, d in s.table.groups), s.pinned, s.policy,
                        w.spec.rate if w else None, w.spec.paused if w else None)

    def _apply_controls(self) -> None:
        """At a round boundary, on the engine's thread: each queued command in order, checked once and
        applied, its future resolved. A policy switch that has to wait stays first (module doc)."""
        self.scheduler.draining = False  # until a switch is found waiting again
        while (pending := self.controls.head()) is not None:
            command = pending.command
            if pending.future.cancelled():
                self.controls.pop()
                continue
            before = self.settings()
            outcome: Change | ControlError
            try:
                if not self._apply(command):
                    self.scheduler.draining = True  # the old policy takes no new request meanwhile
                    return
                outcome = Change(before, self.settings(), command if isinstance(command, Inject) else None)
            except ControlError as exc:
                outcome = exc
            except EngineError as exc:  # a knob's check (ConfigError), a device that cannot build new levels
                field, reason = (exc.field, exc.reason) if isinstance(exc, FieldError) else (command.subject, str(exc))
                outcome = ControlError(field, reason)
            except Exception as exc:  # no control command may stop the engine
                log.exception("applying %r", command)
                outcome = ControlError(command.subject, f"{type(exc).__name__}: {exc}")
            self.controls.pop()
            if isinstance(outcome, Change) and (changes := outcome.changes):
                self._report(ConfigChange(self.device.now(), self.scheduler.round_index, changes, pending.client))
            resolve(pending.future, outcome)

    def _apply(self, command: EngineCommand) -> bool:
        """Check `command` against the state now and apply it (an error changes nothing); False when it
        switches policy while the old one has a prefill in flight: checked, nothing applied yet."""
        s, now = self.scheduler, self.device.now()
        match command:
            case PinLevel(level=level):
                if s.policy == "disagg":
                    raise ControlError("level", "under disagg each instance keeps its own units: switch to pdmux "
                                                "to pin a level")
                s.pin_level(in_range("level", level, 0, len(s.table.groups) - 1))
            case AutoLevel():
                s.pin_level(None)
            case Inject():
                self._inject(command, now)
            case PauseWorkload():
                self._workload().pause()
            case ResumeWorkload():
                self._workload().resume(now)
            case Set():
                return self._set(command)
        return True

    def _set(self, command: Set) -> bool:
        s, knobs, rate = self.scheduler, command.knobs(), command.workload_rate
        switch = command.policy if command.policy != s.policy else None
        workload = self._workload() if rate is not None else None
        if switch == "disagg":
            check_disagg(self.device)
        config = s.config.replace(**knobs) if knobs else s.config
        table = s.table.rebuilt(config) if REBUILD & knobs.keys() else None
        if switch is not None and s.prefill_in_flight:
            return False
        if switch is not None:
            s.get(switch)  # made before anything changes: disagg's second instance may not fit
        if knobs:  # then new levels, which a device may fail to build
            s.set_config(config, table)
        if switch is not None:
            s.switch(switch)
        if workload is not None and rate is not None:
            workload.set_rate(rate, self.device.now())
        return True

    def _workload(self) -> Workload:
        if self.workload is None:
            raise ControlError("workload", "no workload runs here (started without one: --workload none); "
                                           "requests come from the API and injects only")
        return self.workload

    def _inject(self, command: Inject, now: float) -> None:
        """A long prompt arrives now, through the waiting-queue caps (over them: ControlError)."""
        if command.prompt_tokens is not None:
            in_range("prompt_tokens", command.prompt_tokens, 1, self.max_prompt)
        w = self.workload
        arrival = w.inject(now, command.prompt_tokens, command.max_tokens) if w is not None else Arrival(
            now, command.prompt_tokens or LONG_PROMPT_TOKENS, command.max_tokens or INJECT_MAX_TOKENS, "inject")
        try:
            self._arrive(arrival)
        except QueueFullError as exc:
            raise ControlError(Inject.name, str(exc)) from None

    # -- requests --------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
               arrival: float | None = None, source: str = "workload") -> Request:
        """Add a request now: on the engine's thread, or while it is not running. QueueFullError over the caps."""
        req, record = self.intake.submit(prompt_ids, max_tokens, ignore_eos=ignore_eos, arrival=arrival,
                                         source=source, now=self.device.now())
        self._report(record)
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
        return self.intake.enqueue(prompt_ids, params, source, on_update, self.device.now())

    def abort(self, req: Request, reason: str = "abort") -> None:
        """Thread-safe: end `req` at the next round boundary with `reason` ("abort": its client left,
        "stop": a stop string matched); its KV is freed then (after its prefill, if one is in flight)."""
        self.intake.abort(req, reason)

    def _arrive(self, arrival: Arrival) -> Request:
        """Submit a synthetic or injected arrival; QueueFullError over the caps (reported as rejected and
        counted in `refused`), checked before the prompt is made: a refused arrival costs no memory."""
        cfg = self.executor.cfg
        n = max(1, min(arrival.prompt_tokens, cfg.max_context - arrival.max_tokens))
        source = "inject" if arrival.injected else "workload"
        self.intake.check_room(n, source, arrival.time)
        return self.submit(self.prompts.make(n), arrival.max_tokens, ignore_eos=True, arrival=arrival.time,
                           source=source)

    def _take_arrivals(self, workload: Workload) -> None:
        """Submit what the workload has due, telling it how many of its closed-loop requests are
        still in flight and whether its last long prompt still waits for its first token."""
        self._open = [(a, r) for a, r in self._open if not r.finished]
        in_flight = sum(a.kind == "loop" for a, _ in self._open)
        long_waiting = any(a.kind == "long" and not r.output_ids for a, r in self._open)
        for arrival in workload.due(self.device.now(), in_flight, long_waiting):
            try:
                req = self._arrive(arrival)
            except QueueFullError:
                continue  # dropped
            if arrival.kind in ("loop", "long"):
                self._open.append((arrival, req))

    def _take_requests(self) -> None:
        """At a round boundary: queued requests join the scheduler, refusals are reported, aborts applied."""
        taken = self.intake.take()
        for req, cb in taken.watched:
            self._watchers.add(req, cb)
        for record in taken.added:
            self._report(record)
        for arrived, refused in taken.refusals:
            self._report(arrived)
            self._report(refused)
        for req, reason in taken.aborts:
            finish = self.scheduler.abort(req, reason)
            if finish is not None:
                self._report(finish)

    def _stop(self, req: Request) -> None:
        """A caller's stop string matched: end `req` before the next round."""
        finish = self.scheduler.abort(req, "stop")
        if finish is not None:
            self._report(finish)

    def idle(self) -> bool:
        """Nothing queued, waiting, prefilling or decoding."""
        return self.intake.empty and self.scheduler.idle()

    # -- rounds ----------------------------------------------------------------------------
    def step(self) -> RoundRecord:
        self.intake.wake.clear()
        if self.workload is not None:  # what arrived during the last round, then what is asked at its end
            self._take_arrivals(self.workload)
        self._apply_controls()
        self._take_requests()
        if self.scheduler.idle():
            if self.device.virtual:
                self.device.idle(IDLE_S)
            else:
                self.intake.wake.wait(IDLE_S)
                self._apply_controls()
                self._take_requests()
        s = self.scheduler
        record, requests = s.step()
        s.levels.learn(record, self.config, s.table)  # the level rule's model
        self._pace()  # a paced virtual clock: report the round when wall time reaches its end
        for r in requests:  # and under disagg the prefill instance's rounds and KV transfers
            self._report(r)
        self._report(record)
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
        self.controls.fail_all("the engine stopped; nothing was changed")
        self.scheduler.close()
        self.device.close()
