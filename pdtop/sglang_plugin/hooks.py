"""SGLang's scheduler hooked through SGLang's own `HookRegistry`: the targets, the hooks, failing soft.

`install` registers nothing unless the installed SGLang is a release the plugin knows (`SUPPORTED`)
and has every target; otherwise one warning line, and SGLang runs exactly as without pdtop.

Each hook calls SGLang's original as SGLang would, with its arguments untouched, and lets whatever
it raises through; pdtop's own work around it is guarded: the first failure of each kind is one
warning line in SGLang's log, later ones are only counted, and the round goes on as without pdtop.

Across releases `adjust_stream_groups` takes no argument (0.5.11 to 0.5.15) or `running_batch`
(0.5.19 on): the hooks pass every argument through and need none of them (a pin changes the config
SGLang's method reads, not what it is called with); `SetInternalStateReqOutput` gained and lost a
`server_args` field. `process_input_requests` is the one per-round call of every event loop.
"""
from __future__ import annotations

import logging
import pkgutil
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pdtop.engine.errors import ControlError
from pdtop.sglang_plugin import scheduler_facts as facts
from pdtop.sglang_plugin.broadcast import InternalStatePoster
from pdtop.sglang_plugin.knobs import from_internal_state, is_internal_state
from pdtop.sglang_plugin.server_thread import ServerThread
from pdtop.sglang_plugin.settings import Settings
from pdtop.sglang_plugin.tap import TAP_ATTR, SchedulerTap

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import SetInternalStateReq, SetInternalStateReqOutput
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

log = logging.getLogger("pdtop.sglang_plugin")

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
MIXIN = "sglang.srt.multiplex.multiplexing_mixin.SchedulerMultiplexMixin"
SUPPORTED = ((0, 5, 11), (0, 5, 23))  # the first release with sglang.srt.plugins, the newest read


def release(text: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


class Plugin:
    """The hooks of one SGLang process, and the servers they started (one, on TP rank 0)."""

    def __init__(self, settings: Settings, version: str) -> None:
        self.settings, self.version = settings, version
        self.servers: list[ServerThread] = []
        self.posters: list[InternalStatePoster] = []
        self.faults = 0
        self._warned: set[str] = set()

    def hooks(self) -> list[tuple[str, str, Callable[..., Any]]]:
        """(target, HookType name, hook) for SGLang's `HookRegistry.register`."""
        return [(f"{MIXIN}.init_pdmux", "AFTER", self.after_init_pdmux),
                (f"{MIXIN}.adjust_stream_groups", "AROUND", self.around_adjust_stream_groups),
                (f"{SCHEDULER}.process_input_requests", "BEFORE", self.before_round),
                (f"{SCHEDULER}.run_batch", "BEFORE", self.before_run_batch),
                (f"{SCHEDULER}.process_batch_result", "AFTER", self.after_process_batch_result),
                (f"{SCHEDULER}._add_request_to_queue", "AFTER", self.after_add_request_to_queue),
                (f"{SCHEDULER}.set_internal_state", "AROUND", self.around_set_internal_state)]

    def fault(self, where: str, exc: BaseException) -> None:
        """pdtop's side of a hook failed: one warning line the first time, a count after."""
        self.faults += 1
        if where not in self._warned:
            self._warned.add(where)
            log.warning("pdtop: %s failed (%s: %s); SGLang goes on, pdtop may miss what it saw there",
                        where, type(exc).__name__, exc)

    # -- attaching to a scheduler ------------------------------------------------------------------
    def tap_of(self, scheduler: Scheduler) -> SchedulerTap | None:
        tap = scheduler.__dict__.get(TAP_ATTR)
        if tap is None:
            tap = self.attach(scheduler)
        return tap or None

    def attach(self, scheduler: Scheduler) -> SchedulerTap | None:
        """The scheduler's tap, made once (when pdmux is set up, or at its first round); on TP rank 0 it
        starts pdtop's server. A failure leaves the scheduler without one (False), for good."""
        try:
            place = facts.placement(scheduler)
            sm_counts = [(int(p), int(d)) for p, d in scheduler.sm_counts] if hasattr(scheduler, "sm_counts") \
                else None
            send = None
            if not place.alone and place.serves:
                found = facts.internal_state_url(scheduler)
                if found is not None:
                    send = InternalStatePoster(*found)
                    self.posters.append(send)
            tap = SchedulerTap(scheduler, place, version=self.version, device=facts.device(scheduler, sm_counts),
                               send=send)
        except Exception as exc:
            self.fault("attaching to the scheduler", exc)
            scheduler.__dict__[TAP_ATTR] = False
            return None
        scheduler.__dict__[TAP_ATTR] = tap
        if place.serves:
            server = ServerThread(tap, self.settings)
            if server.start():
                self.servers.append(server)
        return tap

    # -- the hooks ---------------------------------------------------------------------------------
    def after_init_pdmux(self, result: None, scheduler: Scheduler, *args: Any, **kwargs: Any) -> None:
        self.tap_of(scheduler)

    def around_adjust_stream_groups(self, original: Callable[..., Any], scheduler: Scheduler, *args: Any,
                                    **kwargs: Any) -> Any:
        tap = self.tap_of(scheduler)
        handed = None
        if tap is not None:
            try:
                handed = tap.pinned_config()
            except Exception as exc:
                self.fault("pinning a level", exc)
        if handed is None:
            result = original(scheduler, *args, **kwargs)
        else:  # SGLang's own rule, with thresholds that choose the pinned level
            kept = scheduler.pdmux_config
            scheduler.pdmux_config = handed
            try:
                result = original(scheduler, *args, **kwargs)
            finally:
                scheduler.pdmux_config = kept
        if tap is not None:
            try:
                tap.switched(result)
            except Exception as exc:
                self.fault("reading SGLang's level", exc)
        return result

    def before_round(self, scheduler: Scheduler, *args: Any, **kwargs: Any) -> None:
        tap = self.tap_of(scheduler)
        if tap is not None:
            try:
                tap.round_boundary()
            except Exception as exc:
                self.fault("closing a round", exc)

    def before_run_batch(self, scheduler: Scheduler, batch: ScheduleBatch | None = None, *args: Any,
                         **kwargs: Any) -> None:
        tap = scheduler.__dict__.get(TAP_ATTR)
        if tap and batch is not None:
            try:
                tap.ran(batch)
            except Exception as exc:
                self.fault("reading a batch", exc)

    def after_process_batch_result(self, result: Any, scheduler: Scheduler, batch: ScheduleBatch | None = None,
                                   *args: Any, **kwargs: Any) -> None:
        tap = scheduler.__dict__.get(TAP_ATTR)
        if tap and batch is not None:
            try:
                tap.results(batch)
            except Exception as exc:
                self.fault("reading a batch's results", exc)

    def after_add_request_to_queue(self, result: None, scheduler: Scheduler, req: Req | None = None, *args: Any,
                                   **kwargs: Any) -> None:
        tap = scheduler.__dict__.get(TAP_ATTR)
        retracted = kwargs.get("is_retracted", args[0] if args else False)
        if tap and req is not None and not retracted:
            try:
                tap.arrived(req)
            except Exception as exc:
                self.fault("reading an arrival", exc)

    def around_set_internal_state(self, original: Callable[..., Any], scheduler: Scheduler,
                                  recv_req: SetInternalStateReq, *args: Any, **kwargs: Any) -> Any:
        """pdtop's changes (every key `pdtop_*`) are applied here on each rank; anything else is SGLang's."""
        server_args = getattr(recv_req, "server_args", None)
        if not is_internal_state(server_args):
            return original(scheduler, recv_req, *args, **kwargs)
        ok = False
        try:
            tap = self.tap_of(scheduler)
            if tap is not None:
                ok = tap.apply_broadcast(*from_internal_state(server_args))
        except ControlError as exc:
            log.warning("pdtop: refused /set_internal_state %s: %s", exc.field, exc.reason)
        except Exception as exc:
            self.fault("applying a /set_internal_state change", exc)
        return internal_state_output(ok)

    def close(self) -> None:
        """Stop the servers and the posting threads (tests; SGLang's processes just exit)."""
        for server in self.servers:
            server.stop()
        for poster in self.posters:
            poster.close()
        self.servers.clear()
        self.posters.clear()


def internal_state_output(updated: bool) -> SetInternalStateReqOutput:
    """SGLang's reply to /set_internal_state (0.5.11 to 0.5.15 also carry `server_args`)."""
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    try:
        return SetInternalStateReqOutput(updated=updated)
    except TypeError:
        return SetInternalStateReqOutput(updated=updated, server_args={})


def _exists(target: str) -> bool:
    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def install(settings: Settings) -> Plugin | None:
    """Register the hooks with SGLang's HookRegistry (`load_plugins` applies them); None, after one
    warning line, when this SGLang is not one the plugin supports."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    version = facts.sglang_version()
    found = release(version)
    if found is None or not SUPPORTED[0] <= found <= SUPPORTED[1]:
        low, high = (".".join(map(str, r)) for r in SUPPORTED)
        log.warning("pdtop: SGLang %s is not a release its plugin supports (%s to %s); SGLang runs without pdtop",
                    version, low, high)
        return None
    plugin = Plugin(settings, version)
    hooks = plugin.hooks()
    missing = [target for target, _, _ in hooks if not _exists(target)]
    if missing:
        log.warning("pdtop: SGLang %s has no %s; SGLang runs without pdtop", version, missing[0])
        return None
    for target, kind, hook in hooks:
        HookRegistry.register(target, hook, HookType[kind])
    return plugin
