"""The engine: scheduler + workload + live control, reporting every round to its sinks.

One thread runs the rounds (`run`). `control` may be called from any thread: it
validates at once (ControlError, nothing changed) and queues the change, which is
applied at the next round boundary and reported as a `ConfigChange`.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pdtop.engine.devices.base import Device
from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.executor import Executor
from pdtop.engine.scheduling.control import Change, validate
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.scheduler import Scheduler
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.workload import LONG_PROMPT_TOKENS, Arrival, PromptMaker, Workload

Record = RoundRecord | RequestRecord | ConfigChange
Sink = Callable[[Record], None]
IDLE_S = 0.05  # how long an idle round waits for arrivals


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive after start-up (model, tokenizer, modules: about 180k
    objects with the default model) out of the collector's reach. A full collection over them took
    120 ms here, a stall in whichever round it fell; after this it takes well under 1 ms."""
    gc.collect()
    gc.freeze()


class Engine:
    def __init__(self, *, device: Device, executor: Executor, table: SplitTable, config: PdmuxConfig,
                 policy: str, workload: Workload | None, prompts: PromptMaker, model_name: str,
                 temperature: float = 0.0, seed: int = 0):
        self.device, self.executor, self.model_name = device, executor, model_name
        self.scheduler = Scheduler(device, executor, table, config, policy)
        self.workload = workload
        self.prompts = prompts
        self.temperature, self.seed = temperature, seed
        self._sinks: list[Sink] = []
        self._pending: deque[tuple[Change, str | None]] = deque()
        self._deferred_policy: tuple[str, str | None] | None = None
        self._lock = threading.Lock()
        self._next_id = 0

    # -- what clients see ------------------------------------------------------------------
    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        if sink in self._sinks:
            self._sinks.remove(sink)

    def _emit(self, record: Record) -> None:
        for sink in list(self._sinks):
            sink(record)

    @property
    def config(self) -> PdmuxConfig:
        return self.scheduler.config

    def config_dict(self) -> dict[str, Any]:
        s = self.scheduler
        out = self.config.to_dict()
        out.update(policy=s.policy, pinned_level=s.pinned, levels=[list(g) for g in s.table.groups],
                   workload_rate=self.workload.spec.rate if self.workload else 0.0,
                   workload_paused=self.workload.spec.paused if self.workload else True)
        return out

    def describe(self) -> dict[str, Any]:
        cfg = self.executor.cfg
        return {
            "model": self.model_name, "num_layers": cfg.num_layers, "max_context": cfg.max_context,
            "device": self.device.describe(), "unit_name": self.device.unit_name, "units": self.device.units,
            "virtual_clock": self.device.virtual, "levels": [list(g) for g in self.scheduler.table.groups],
            "config": self.config_dict(), "policy": self.scheduler.policy,
        }

    @property
    def max_prompt(self) -> int:
        return max(1, self.executor.cfg.max_context - 1)

    # -- control ---------------------------------------------------------------------------
    def control(self, msg: Any, client: str | None = None) -> None:
        """Validate now (ControlError changes nothing); apply at the next round boundary."""
        with self._lock:
            change = validate(msg, config=self.config, table=self.scheduler.table, max_prompt=self.max_prompt)
            self._pending.append((change, client))

    def _apply(self, change: Change, client: str | None) -> dict[str, dict[str, Any]]:
        s, w, now = self.scheduler, self.workload, self.device.now()
        diff: dict[str, dict[str, Any]] = {}

        def note(name: str, old: Any, new: Any) -> None:
            if old != new:
                diff[name] = {"old": old, "new": new}

        if change.cmd in ("pin_level", "auto_level"):
            level = change.values["level"] if change.cmd == "pin_level" else None
            if level is None or level < len(s.table.groups):  # new levels may have come since it was validated
                note("pinned_level", s.pinned, level)
                s.pin_level(level)
        elif change.cmd == "inject":
            tokens, max_tokens = change.values.get("prompt_tokens"), change.values.get("max_tokens")
            if w is not None:
                w.inject(now, tokens, max_tokens)
            else:
                self.submit(self.prompts.make(tokens or LONG_PROMPT_TOKENS), max_tokens or 64)
            diff["inject"] = {"old": None, "new": tokens or "default"}
        elif change.cmd in ("pause_workload", "resume_workload") and w is not None:
            paused = change.cmd == "pause_workload"
            note("workload_paused", w.spec.paused, paused)
            w.pause() if paused else w.resume(now)
        elif change.cmd == "set":
            values = dict(change.values)
            if "policy" in values:
                policy = values.pop("policy")
                if s.prefill_in_flight and policy != s.policy:
                    self._deferred_policy = (policy, client)  # switched once in-flight prefill is done
                else:
                    note("policy", s.policy, policy)
                    s.set_policy(policy)
            if "workload_rate" in values:
                rate = values.pop("workload_rate")
                if w is not None:
                    note("workload_rate", w.spec.rate, rate)
                    w.set_rate(rate, now)
            if values:
                old, old_levels, old_pin = s.config, [list(g) for g in s.table.groups], s.pinned
                s.set_config(old.replace(**values), change.table)
                for name in values:
                    note(name, getattr(old, name), getattr(s.config, name))
                if change.table is not None:
                    note("levels", old_levels, [list(g) for g in change.table.groups])
                    note("pinned_level", old_pin, s.pinned)  # a pin past the new last level is dropped
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
        while self._pending:
            with self._lock:
                change, client = self._pending.popleft()
            diff = self._apply(change, client)
            if diff:
                self._emit(ConfigChange(self.device.now(), s.round_index, diff, client))

    # -- requests --------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
               arrival: float | None = None) -> Request:
        params = SamplingParams(temperature=self.temperature, seed=self.seed + self._next_id, max_tokens=max_tokens,
                                ignore_eos=ignore_eos)
        req = Request(self._next_id, list(prompt_ids), params, self.device.now() if arrival is None else arrival)
        self._next_id += 1
        self._emit(self.scheduler.add(req))
        return req

    def _arrive(self, arrival: Arrival) -> None:
        cfg = self.executor.cfg
        n = max(1, min(arrival.prompt_tokens, cfg.max_context - arrival.max_tokens))
        self.submit(self.prompts.make(n), arrival.max_tokens, ignore_eos=True, arrival=arrival.time)

    # -- rounds ----------------------------------------------------------------------------
    def step(self) -> RoundRecord:
        self._apply_pending()
        if self.workload is not None:
            for arrival in self.workload.due(self.device.now()):
                self._arrive(arrival)
        if self.scheduler.idle():
            self.device.idle(IDLE_S)
        record, requests = self.scheduler.step()
        for r in requests:
            self._emit(r)
        self._emit(record)
        return record

    def run(self, stop: threading.Event, realtime: bool = True, speed: float = 1.0) -> None:
        """Run rounds until `stop` is set. A virtual clock is paced to wall time x `speed` when `realtime`."""
        freeze_startup_heap()
        wall0, clock0 = time.perf_counter(), self.device.now()
        while not stop.is_set():
            self.step()
            if realtime and self.device.virtual:
                ahead = (self.device.now() - clock0) / speed - (time.perf_counter() - wall0)
                if ahead > 0:
                    stop.wait(ahead)

    def run_until_idle(self, max_rounds: int = 1_000_000) -> int:
        """Run rounds until every submitted request has finished (no workload arrivals)."""
        n = 0
        while not self.scheduler.idle() and n < max_rounds:
            self.step()
            n += 1
        return n

    def close(self) -> None:
        self.device.close()
