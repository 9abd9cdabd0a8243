"""What the dashboard keeps of a fleet (`pdtop attach URL URL ...`): the latest row of every server, a
`ScrapeView` per server for its single-server view (Enter on its row), and the prefill:decode balance
in words.

The balance follows the seed's warning about disaggregation, that one side queues while the other side
idles: prefill servers with requests waiting while the decode servers' KV is mostly free want more
prefill capacity; decode servers full of KV with requests waiting for it, while prefill is idle, want
more decode capacity; requests piling up in the decode transfer queue point at the KV transfer itself.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdtop.telemetry.events import Fleet, FleetServer, FleetTarget, Metrics, ScrapeTarget
from pdtop.ui.engine_info import EngineInfo
from pdtop.ui.scrape_view import ScrapeView, number

if TYPE_CHECKING:  # state.py imports this module
    from pdtop.ui.state import DashboardState


Figure = Callable[[Metrics], float | str | None]
GROWING_S = 10.0  # a queue is growing when it is longer than this long ago
PREFILL_QUEUED = 2.0  # waiting requests per prefill server that count as a queue
DECODE_KV_IDLE, DECODE_KV_FULL = 0.5, 0.9


@dataclass
class FleetView:
    target: FleetTarget
    servers: list[FleetServer] = field(default_factory=list)
    views: dict[str, ScrapeView] = field(default_factory=dict)  # by the server's URL
    selected: str | None = None  # the server whose single-server view the main screen shows
    time: float = 0.0
    _prefill_waiting: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))

    def take(self, fleet: Fleet) -> ScrapeView | None:
        """Take one `fleet` event; returns the selected server's view (the first server's at first)."""
        if fleet.time < self.time:  # a replay went back
            self._prefill_waiting.clear()
        self.time, self.servers = fleet.time, fleet.servers
        for s in fleet.servers:
            view = self.views.get(s.url)
            if s.metrics is None:
                continue
            target = ScrapeTarget(s.url, s.engine or "?", s.model_name, [s.model_name] if s.model_name else [],
                                  self.target.interval_s, self.target.window_s)
            if view is None or view.target.engine != target.engine:
                view = self.views[s.url] = ScrapeView(target)
            if view.latest is None or view.latest.time != s.metrics.time:
                view.take(s.metrics)
        if len(self.views) > 2 * len(fleet.servers) + 16:  # a replay of another fleet: forget the gone
            self.views = {s.url: v for s in fleet.servers if (v := self.views.get(s.url)) is not None}
        waiting = self._side_sum("prefill", lambda m: m.waiting)
        if waiting is not None:
            self._prefill_waiting.append((fleet.time, waiting))
        if self.selected is None and fleet.servers:
            self.selected = fleet.servers[0].url
        return self.views.get(self.selected) if self.selected else None

    def select(self, url: str) -> ScrapeView | None:
        self.selected = url
        return self.views.get(url)

    def copy(self) -> FleetView:
        return FleetView(self.target, list(self.servers), {k: v.copy() for k, v in self.views.items()},
                         self.selected, self.time, deque(self._prefill_waiting, maxlen=256))

    # ---- the balance --------------------------------------------------------------------

    def _live(self, role: str) -> list[Metrics]:
        return [s.metrics for s in self.servers if s.role == role and s.state == "live" and s.metrics is not None]

    def _side_sum(self, role: str, get: Figure) -> float | None:
        values = [number(get(m)) for m in self._live(role)]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    def _side_mean(self, role: str, get: Figure) -> float | None:
        total, n = self._side_sum(role, get), len([m for m in self._live(role) if number(get(m)) is not None])
        return total / n if total is not None and n else None

    def _growing(self, now_waiting: float) -> bool:
        before = [w for t, w in self._prefill_waiting if t <= self.time - GROWING_S]
        return bool(before) and now_waiting > before[-1]

    def balance(self) -> tuple[str, str]:
        """(severity, words): "ok" | "warning", and the P:D balance in one sentence."""
        prefill, decode = self._live("prefill"), self._live("decode")
        if not prefill and not decode:
            return "ok", "no prefill or decode servers: nothing is disaggregated here"
        if not prefill or not decode:
            missing = "prefill" if not prefill else "decode"
            return "warning", f"no live {missing} server: disaggregated requests cannot finish"
        waiting = (self._side_sum("prefill", lambda m: m.waiting) or 0.0) + \
            (self._side_sum("prefill", lambda m: m.disagg.prefill_bootstrap_queue if m.disagg else None) or 0.0)
        decode_kv = self._side_mean("decode", lambda m: m.kv_usage)
        prefill_kv = self._side_mean("prefill", lambda m: m.kv_usage)
        decode_waiting = (self._side_sum("decode", lambda m: m.waiting) or 0.0) + \
            (self._side_sum("decode", lambda m: m.disagg.decode_prealloc_queue if m.disagg else None) or 0.0)
        transfer = self._side_sum("decode", lambda m: m.disagg.decode_transfer_queue if m.disagg else None) or 0.0
        queue = "growing" if self._growing(waiting) else "queued"
        if waiting >= PREFILL_QUEUED * len(prefill) and decode_kv is not None and decode_kv < DECODE_KV_IDLE:
            return "warning", (f"prefill queue {queue} ({waiting:.0f} waiting) while the decode pool runs at "
                               f"{decode_kv:.0%} of its KV: add prefill capacity")
        if decode_kv is not None and decode_kv >= DECODE_KV_FULL and decode_waiting > 0 and waiting == 0:
            idle = f" (prefill KV {prefill_kv:.0%})" if prefill_kv is not None else ""
            return "warning", (f"decode pool at {decode_kv:.0%} of its KV with {decode_waiting:.0f} waiting for it "
                               f"while prefill idles{idle}: add decode capacity")
        if transfer >= max(4.0, 2 * len(decode)):
            return "warning", f"{transfer:.0f} requests wait in the decode transfer queue: the KV transfer is the " \
                              "bottleneck (check the interconnect)"
        kv = f"{decode_kv:.0%}" if decode_kv is not None else "–"
        return "ok", f"balanced: prefill {waiting:.0f} waiting, decode KV {kv}"


def on_fleet(state: DashboardState, fleet: Fleet) -> None:
    """`DashboardState`'s handler of a `fleet` event (one without its hello is ignored)."""
    if state.fleet is not None:
        show_server(state, state.fleet.take(fleet))


def show_server(state: DashboardState, view: ScrapeView | None) -> None:
    """The main screen shows this fleet server's single-server view (Enter on its row)."""
    state.scrape = view
    if view is not None:
        state.info = EngineInfo(model=view.target.model_name or "?", device=view.engine_name)
    state.version += 1
