"""One SGLang scheduler as pdtop's records: what pdtop's telemetry server serves from inside SGLang.

A `SchedulerTap` is kept on its scheduler object (`TAP_ATTR`). SGLang's scheduler thread calls it
through the hooks (`hooks.py`): `round_boundary` once a round (SGLang's `process_input_requests`,
called once per round by every event loop), `ran` before each `run_batch`, `switched` after each
`adjust_stream_groups`, `results` after each `process_batch_result`, `arrived` when a request joins
the waiting queue. At each boundary it closes the round before (a `RoundRecord`) and applies the
control changes queued since: SGLang reads them at its next switch point or prefill slice, never
mid-round. The telemetry server calls `describe`, `config_record`, `add_sink`/`remove_sink` and
`control` from its own thread. Records are built only while a sink listens; with nobody attached, a
round costs a few attribute reads and counters.

SGLang's loop spins while idle: rounds with no forward pass are not reported one by one, only the
first after work and then one each `IDLE_REPORT_S`.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from pdtop.engine.control import Change, Settings, resolve
from pdtop.engine.description import DeviceDescription, EngineConfig, EngineDescription, Totals
from pdtop.engine.errors import ControlError
from pdtop.engine.records import ConfigChange, PrefillProgress, RequestRecord, RoundRecord
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.sinks import Sink, Sinks
from pdtop.sglang_plugin.knobs import KnobChange, Knobs, check, pin_thresholds, to_internal_state, verify

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.multiplex.pdmux_context import PDMuxConfig

    from pdtop.engine.scheduling.commands import EngineCommand

TAP_ATTR = "_pdtop_tap"
IDLE_REPORT_S = 0.5
MAX_TRACKED = 65536  # requests whose ids and times are kept (the oldest go first)
FINISH_REASONS = {"FINISH_MATCHED_TOKEN": "eos", "FINISH_LENGTH": "length", "FINISH_MATCHED_STR": "stop",
                  "FINISHED_MATCHED_REGEX": "stop", "FINISH_ABORT": "abort"}

Send = Callable[[dict[str, int], "Future[Change]"], None]  # posts a change to every rank


@dataclasses.dataclass
class Placement:
    """Where this scheduler sits among SGLang's processes, and what that allows."""

    tp_rank: int = 0
    tp_size: int = 1
    dp_rank: int | None = None
    dp_size: int = 1
    pp_rank: int = 0
    attn_dp: bool = False

    @property
    def serves(self) -> bool:
        """The one scheduler that runs pdtop's server: TP rank 0 of the first (or only) replica."""
        return self.tp_rank == 0 and self.pp_rank == 0 and self.dp_rank in (None, 0)

    @property
    def alone(self) -> bool:
        """No other scheduler runs this server's rounds: a change may be applied here alone (with data
        parallelism the replicas take it together, so that they keep one configuration)."""
        return self.tp_size == 1 and self.dp_size == 1 and not self.attn_dp


class SchedulerTap:
    def __init__(self, scheduler: Scheduler, placement: Placement, *, version: str, device: DeviceDescription,
                 send: Send | None = None) -> None:
        """`send`: how a change reaches every rank when this one is not alone (None: control refused)."""
        self.scheduler = scheduler
        self.placement = placement
        self.version = version
        self.device = device
        self.send = send
        self.t0 = time.monotonic()
        self.sinks = Sinks()
        self.pdmux = bool(getattr(scheduler, "enable_pdmux", False)) and hasattr(scheduler, "sm_counts")
        model_config = scheduler.model_config
        self.num_layers = int(model_config.num_hidden_layers)
        self.max_context = int(getattr(model_config, "context_len", 0) or 0)
        args = getattr(scheduler, "server_args", None)
        self.model = str(getattr(args, "served_model_name", None) or getattr(args, "model_path", None) or "?")
        self.chunk_size = max(0, int(getattr(args, "chunked_prefill_size", 0) or 0))
        if self.pdmux:
            self.levels = [(int(p), int(d)) for p, d in scheduler.sm_counts]
            cfg = scheduler.pdmux_config
        else:
            self.levels = [(device.units, device.units)]
            from sglang.srt.multiplex.pdmux_context import PDMuxConfig
            cfg = PDMuxConfig()
        self.knobs = Knobs(None, int(cfg.decode_bs_divisor), int(cfg.split_forward_token_budget),
                           tuple(int(t) for _, _, t in cfg.manual_divisions))
        self._sm_group_num = int(cfg.sm_group_num)
        self._pinned_cfg: PDMuxConfig | None = None  # what adjust_stream_groups is handed under a pin
        self.level = 0  # SGLang starts at stream group 0 (init_pdmux)
        self.index = 0  # the next round record's index
        self.totals = {"arrived": 0, "first_token": 0, "finished": 0, "rejected": 0}
        self._pending: deque[tuple[KnobChange, str | None, Future[Change]]] = deque()
        self._tickets: dict[int, tuple[Future[Change], str | None]] = {}  # changes sent to every rank
        self._ticket_ids = itertools.count(1)
        # the round in progress
        self._start = self._last_report = self.t0
        self._busy_before = False
        self._decode_bs = 0
        self._decode_start: float | None = None
        self._decode_s = 0.0
        self._split: tuple[ScheduleBatch, int, int] | None = None  # (batch, layers done before its slice, slice)
        self._extends: list[ScheduleBatch] = []  # prefill batches of the normal loops
        self._tokens = 0
        # requests, while someone listens: SGLang's rid -> pdtop's int id, when each arrived, its TTFT
        self._ids: dict[str, int] = {}
        self._arrivals: dict[int, float] = {}
        self._ttfts: dict[int, float] = {}
        self._next_id = itertools.count(1)

    # -- what the telemetry server reads -------------------------------------------------------------
    def add_sink(self, sink: Sink) -> None:
        self.sinks.add(sink)

    def remove_sink(self, sink: Sink) -> None:
        self.sinks.remove(sink)

    @property
    def policy(self) -> str:
        return "pdmux" if self.pdmux else "chunked"

    def config_record(self) -> EngineConfig:
        k = self.knobs
        return EngineConfig(
            sm_group_num=len(self.levels) if self.pdmux else self._sm_group_num,
            manual_divisions=k.manual_divisions(self.levels), split_forward_token_budget=k.split_forward_token_budget,
            decode_bs_divisor=k.decode_bs_divisor, chunk_size=self.chunk_size, policy=self.policy,
            pinned_level=k.pinned_level, levels=list(self.levels), workload_rate=0.0, workload_paused=True,
            level_rule="sglang")

    def describe(self) -> EngineDescription:
        return EngineDescription(
            model=self.model, num_layers=self.num_layers, max_context=self.max_context, device=self.device,
            unit_name=self.device.unit_name, units=self.device.units, virtual_clock=False, levels=list(self.levels),
            config=self.config_record(), policy=self.policy, runtime=self.runtime(), totals=Totals(**self.totals))

    def runtime(self) -> dict[str, object]:
        """For people: which SGLang, its parallelism, and how control reaches it."""
        p = self.placement
        return {"server": f"SGLang {self.version}", "pdmux": self.pdmux, "tp_size": p.tp_size, "dp_size": p.dp_size,
                "dp_attention": p.attn_dp, "control": self.control_route(),
                "kv_cache": {"tokens": self._kv()[1]}}

    def control_route(self) -> str:
        if not self.pdmux:
            return "none: SGLang runs without --enable-pdmux"
        if self.placement.alone:
            return "in the scheduler, at round boundaries"
        if self.send is not None:
            return "through SGLang's /set_internal_state, to every rank"
        return "none: several ranks and no route to SGLang's /set_internal_state (watch-only)"

    # -- control ---------------------------------------------------------------------------------
    def control(self, command: EngineCommand, client: str | None = None) -> Future[Change]:
        """Check `command` against SGLang's levels now and queue it; the future gets the `Change` once it
        is applied at a round boundary (on every rank together when there are several), or the
        ControlError that refused it, nothing changed."""
        future: Future[Change] = Future()
        try:
            change = check(command, self.levels, self.pdmux)
            if not self.placement.alone and self.send is None:
                raise ControlError("cmd", "SGLang runs several schedulers here and pdtop cannot reach its "
                                          "/set_internal_state, which would change them all in the same round: "
                                          "watch-only")
        except ControlError as exc:
            future.set_exception(exc)
            return future
        if self.send is None:
            self._pending.append((change, client, future))
        else:
            ticket = next(self._ticket_ids)
            self._tickets[ticket] = (future, client)
            future.add_done_callback(lambda _: self._tickets.pop(ticket, None))
            self.send(to_internal_state(change, ticket, client), future)
        return future

    def apply_broadcast(self, change: KnobChange, ticket: int | None, client: str | None) -> bool:
        """A change every rank received through /set_internal_state, in the same round (any rank):
        applied now, at the round boundary where SGLang dispatches it. False: refused, nothing changed."""
        sent = self._tickets.get(ticket) if ticket is not None else None
        try:
            if not self.pdmux:
                raise ControlError("cmd", "this SGLang server runs without --enable-pdmux")
            verify(change, self.levels)
        except ControlError as exc:
            if sent is not None:
                resolve(sent[0], exc)
            return False
        applied = self._apply(change, client if sent is None else sent[1])
        if sent is not None:
            resolve(sent[0], applied)
        return True

    def settings(self, knobs: Knobs) -> Settings:
        """The knobs as pdtop's engine holds its own (a `Change` is two of these)."""
        rows = [list(r) for r in knobs.manual_divisions(self.levels)]
        pdmux = PdmuxConfig(sm_group_num=len(self.levels), manual_divisions=rows,
                            decode_bs_divisor=knobs.decode_bs_divisor,
                            split_forward_token_budget=knobs.split_forward_token_budget)
        return Settings(pdmux, tuple(self.levels), knobs.pinned_level, self.policy, None, None)

    def _apply(self, change: KnobChange, client: str | None) -> Change:
        s, old = self.scheduler, self.knobs
        new = old.after(change)
        applied = Change(self.settings(old), self.settings(new))  # checks the new knobs as pdtop's config
        if (new.decode_bs_divisor, new.split_forward_token_budget, new.thresholds) != \
                (old.decode_bs_divisor, old.split_forward_token_budget, old.thresholds):
            s.pdmux_config = dataclasses.replace(
                s.pdmux_config, decode_bs_divisor=new.decode_bs_divisor,
                split_forward_token_budget=new.split_forward_token_budget,
                manual_divisions=[list(r) for r in new.manual_divisions(self.levels)])
        self.knobs = new
        self._pinned_cfg = None
        changes = applied.changes
        if changes:
            self.sinks.emit(ConfigChange(time.monotonic() - self.t0, self.index, changes, client))
        return applied

    def _apply_pending(self) -> None:
        while self._pending:
            change, client, future = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                resolve(future, self._apply(change, client))
            except Exception as exc:  # SGLang's config refused it: nothing of it was kept
                resolve(future, ControlError("cmd", f"not applied: {type(exc).__name__}: {exc}"))

    def pinned_config(self) -> PDMuxConfig | None:
        """What `adjust_stream_groups` should read while a level is pinned: SGLang's config with thresholds
        that make its own rule choose that level; None when nothing is pinned."""
        level = self.knobs.pinned_level
        if level is None:
            return None
        if self._pinned_cfg is None:
            splits = self.levels[1:-1]
            rows = [[p, d, t] for (p, d), t in zip(splits, pin_thresholds(level, len(splits)), strict=True)]
            self._pinned_cfg = dataclasses.replace(self.scheduler.pdmux_config, manual_divisions=rows)
        return self._pinned_cfg

    # -- rounds ----------------------------------------------------------------------------------
    def round_boundary(self) -> None:
        """A round begins: report the one that ended (if it did anything, or to say idle now and then)
        and apply the changes queued since."""
        now = time.monotonic()
        worked = self._decode_bs > 0 or self._split is not None or bool(self._extends)
        try:
            if worked or self._busy_before or now - self._last_report >= IDLE_REPORT_S:
                began = self._start if worked else self._last_report  # an idle report covers the idle spins
                index, self.index = self.index, self.index + 1
                self._last_report, self._busy_before = now, worked
                if self.sinks.all:
                    self.sinks.emit(self._round_record(index, began, now))
        finally:  # whatever reading the round met, the next one starts clean and the changes are applied
            self._start = now
            self._decode_bs, self._decode_start, self._decode_s = 0, None, 0.0
            self._split, self._tokens = None, 0
            self._extends.clear()
            if self._pending:
                self._apply_pending()

    def _round_record(self, index: int, began: float, now: float) -> RoundRecord:
        s = self.scheduler
        p, d = self.levels[self.level] if self.level < len(self.levels) else (0, 0)
        used, capacity = self._kv()
        running = s.running_batch
        return RoundRecord(
            index=index, time=now - self.t0, policy=self.policy, level=self.level, prefill_units=p,
            decode_units=d, pinned=self.knobs.pinned_level is not None, decode_bs=self._decode_bs,
            decode_step_s=self._decode_s, round_s=now - began, prefills=self._prefills(),
            tokens_emitted=self._tokens, waiting=len(s.waiting_queue),
            running=running.batch_size() if running is not None else 0, kv_used_tokens=used,
            kv_capacity_tokens=capacity, bytes_moved=0.0, flops=0.0)

    def _prefills(self) -> list[PrefillProgress]:
        out = []
        if self._split is not None:
            batch, done, k = self._split
            out.append(PrefillProgress([self._id(r.rid) for r in batch.reqs], int(batch.extend_num_tokens), done,
                                       self.num_layers, k))
        for batch in self._extends:  # a normal loop's prefill runs every layer in its round
            out.append(PrefillProgress([self._id(r.rid) for r in batch.reqs], int(batch.extend_num_tokens), 0,
                                       self.num_layers, self.num_layers))
        return out

    def _kv(self) -> tuple[int, int]:
        """KV tokens in use and SGLang's capacity, as its `token usage` counts them."""
        s = self.scheduler
        capacity = int(getattr(s, "max_total_num_tokens", 0) or 0)
        if not capacity:
            return 0, 0
        free = s.token_to_kv_pool_allocator.available_size() + s.tree_cache.evictable_size()
        return max(0, capacity - int(free)), capacity

    def ran(self, batch: ScheduleBatch) -> None:
        """Before SGLang's `run_batch(batch)`: a decode step, a split prefill's slice, or a prefill."""
        mode = batch.forward_mode
        if mode.is_decode():
            self._decode_bs = batch.batch_size()
            self._decode_start = time.perf_counter()
        elif mode.is_split_prefill():
            self._split = (batch, int(batch.split_index), int(batch.split_forward_count))
        elif mode.is_extend():
            self._extends.append(batch)

    def switched(self, result: tuple[int, object]) -> None:
        """After `adjust_stream_groups`: the level SGLang chose (or was handed under a pin)."""
        self.level = int(result[0])

    def results(self, batch: ScheduleBatch) -> None:
        """After `process_batch_result(batch, ...)`: tokens out, first tokens, finished requests."""
        now = time.monotonic()
        if batch.forward_mode.is_decode():
            self._tokens += batch.batch_size()
            if self._decode_start is not None:
                self._decode_s = time.perf_counter() - self._decode_start
        listening = bool(self.sinks.all)
        prefill = not batch.forward_mode.is_decode()
        for req in batch.reqs:
            if prefill:
                if getattr(req, "is_chunked", 0) > 0:  # a chunk of its prompt: no token yet
                    continue
                self._tokens += 1
                self.totals["first_token"] += 1
                if listening:
                    self._first_token(req, now)
            if req.finished_reason is not None:
                self.totals["finished"] += 1
                if listening:
                    self._finish(req, now)

    def arrived(self, req: Req) -> None:
        """A request joined SGLang's waiting queue."""
        self.totals["arrived"] += 1
        if self.sinks.all:
            now = time.monotonic()
            rid = self._id(req.rid)
            self._arrivals[rid] = now
            self.sinks.emit(RequestRecord("arrival", rid, now - self.t0, len(req.origin_input_ids), source="api"))

    def _first_token(self, req: Req, now: float) -> None:
        rid = self._id(req.rid)
        arrived = self._arrivals.pop(rid, None)
        ttft = None if arrived is None else now - arrived
        if ttft is not None:
            self._ttfts[rid] = ttft
        self.sinks.emit(RequestRecord("first_token", rid, now - self.t0, len(req.origin_input_ids),
                                      len(req.output_ids), ttft, source="api"))

    def _finish(self, req: Req, now: float) -> None:
        rid = self._id(req.rid)
        del self._ids[req.rid]
        self._arrivals.pop(rid, None)
        reason = FINISH_REASONS.get(type(req.finished_reason).__name__, "eos")
        self.sinks.emit(RequestRecord("finish", rid, now - self.t0, len(req.origin_input_ids), len(req.output_ids),
                                      self._ttfts.pop(rid, None), finish_reason=reason, source="api"))

    def _id(self, rid: str) -> int:
        """pdtop's int id of SGLang's request id (a string), the same for as long as it is tracked."""
        i = self._ids.get(rid)
        if i is None:
            i = self._ids[rid] = next(self._next_id)
            if len(self._ids) > MAX_TRACKED:
                oldest = self._ids.pop(next(iter(self._ids)))
                self._arrivals.pop(oldest, None)
                self._ttfts.pop(oldest, None)
        return i
