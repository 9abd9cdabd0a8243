"""The dashboard's state, filled from events (live or replayed: the same events).

`DashboardState.ingest` decodes each received event once (`decode_event`: a field that is
missing or of the wrong type is refused, never read as 0) and keeps the latest values and
appends to bounded buffers, so it is cheap and events are taken at full rate; panels read
the derived figures on the repaint tick. Nothing here imports Textual, so the model is
tested with plain event dicts.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.records import PrefillProgress, RequestRecord, RoundRecord
from pdtop.telemetry.decode import EventError, UnknownEventType, decode_event
from pdtop.telemetry.events import ConfigEvent, Dropped, EngineConfig, ErrorNotice, Event, Hello, Hw, Seek
from pdtop.ui.stats import bucket_max, summary


@dataclass(slots=True)
class RoundPoint:
    """The few figures of a round the rolling charts need."""

    time: float
    decode_step_s: float
    round_s: float
    bytes_moved: float
    tokens: int
    decode_bs: int


@dataclass
class EngineInfo:
    """What `hello` says about the engine, with what to show before it came."""

    model: str = "?"
    device: str = "?"
    unit_name: str = "units"
    units: int = 0
    peak_bytes_per_s: float | None = None

    @classmethod
    def from_hello(cls, hello: Hello) -> EngineInfo:
        e = hello.engine
        return cls(model=e.model, device=e.device.name, unit_name=e.unit_name, units=e.units,
                   peak_bytes_per_s=e.device.peak_bw)


@dataclass
class PrefillView:
    """One in-flight prefill as the prefill panel shows it."""

    request_ids: list[int]
    tokens: int
    layers_done: int
    layers_total: int
    layers_per_round: int
    eta_s: float | None


@dataclass
class DashboardState:
    """Everything the panels show. Feed it with `ingest(event)`; read it on the tick."""

    window_s: float = 30.0  # engine-clock seconds the rolling charts and figures cover
    max_rounds: int = 16384
    max_requests: int = 4096

    hello: bool = False
    client_id: str | None = None
    readonly: bool = False
    server_version: str | None = None
    info: EngineInfo = field(default_factory=EngineInfo)
    config: EngineConfig | None = None  # the whole configuration, from hello, config and seek events
    recording: str | None = None  # path this dashboard asked the server to record to
    api: str | None = None  # the server's OpenAI-compatible API (hello.api)

    # the latest round
    rounds_seen: int = 0
    round_index: int = -1
    time: float = 0.0
    policy: str = "?"
    level: int | None = None
    pinned: bool = False
    prefill_units: int = 0
    decode_units: int = 0
    decode_bs: int = 0
    waiting: int = 0
    running: int = 0
    kv_used: int = 0
    kv_capacity: int = 0
    prefills: list[PrefillView] = field(default_factory=list)

    rounds: deque[RoundPoint] = field(default_factory=deque)
    ttfts: deque[float] = field(default_factory=deque)
    itls: deque[float] = field(default_factory=deque)
    arrivals: int = 0
    first_tokens: int = 0
    finished: int = 0
    config_changes: deque[ConfigEvent] = field(default_factory=lambda: deque(maxlen=64))
    errors: deque[ErrorNotice] = field(default_factory=lambda: deque(maxlen=64))
    dropped: int = 0
    hw: Hw | None = None
    events: int = 0  # events received, whether understood or not
    skipped: int = 0  # of a type this pdtop does not know (a newer server's): ignored
    invalid: int = 0  # refused by `decode_event`; `invalid_reason` says why the latest was
    invalid_reason: str = ""
    version: int = 0  # bumped by every event that changed something; the tick repaints when it moved

    itl_slo_s: float | None = None  # the operator's ITL SLO line (a dashboard setting)
    _prefill_first_seen: dict[tuple[int, ...], tuple[float, int]] = field(default_factory=dict, repr=False)
    _window_cache: tuple[int, list[RoundPoint]] = field(default=(-1, []), repr=False)

    def __post_init__(self) -> None:
        self.rounds = deque(self.rounds, maxlen=self.max_rounds)
        self.ttfts = deque(self.ttfts, maxlen=self.max_requests)
        self.itls = deque(self.itls, maxlen=self.max_requests * 8)

    # ---- ingest -------------------------------------------------------------------------

    def ingest(self, raw: dict[str, Any]) -> Event | None:
        """Take one received event; returns it decoded, or None when it was skipped (unknown
        type) or refused (not valid: counted in `invalid`, nothing else changes)."""
        self.events += 1
        try:
            event = decode_event(raw)
        except UnknownEventType:
            self.skipped += 1
            return None
        except EventError as exc:
            self.invalid += 1
            self.invalid_reason = str(exc)
            return None
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            self.version += 1
        return event

    def _on_hello(self, hello: Hello) -> None:
        self.hello = True
        self.client_id = hello.client_id
        self.readonly = hello.readonly
        self.server_version = hello.pdtop
        self.info = EngineInfo.from_hello(hello)
        self.api = hello.api
        self._set_config(hello.engine.config)

    def _set_config(self, config: EngineConfig) -> None:
        self.config = config
        self.policy = config.policy

    def _on_round(self, r: RoundRecord) -> None:
        t = r.time
        if self.rounds and t < self.rounds[-1].time:
            self.reset_series()  # the clock went back: a new engine, or a replay seek
        self.rounds_seen += 1
        self.round_index = r.index
        self.time = t
        self.policy = r.policy
        self.level = r.level
        self.pinned = r.pinned
        self.prefill_units = r.prefill_units
        self.decode_units = r.decode_units
        self.decode_bs = r.decode_bs
        self.waiting = r.waiting
        self.running = r.running
        self.kv_used = r.kv_used_tokens
        self.kv_capacity = r.kv_capacity_tokens
        self.rounds.append(RoundPoint(t, r.decode_step_s, r.round_s, r.bytes_moved, r.tokens_emitted, r.decode_bs))
        self._update_prefills(r.prefills, t)

    def _update_prefills(self, progress: list[PrefillProgress], t: float) -> None:
        seen: dict[tuple[int, ...], tuple[float, int]] = {}
        views: list[PrefillView] = []
        mean_round = self.mean_round_s()
        for p in progress:
            key = tuple(p.request_ids)
            done, total, k = p.layers_done, p.layers_total, p.layers_per_round
            first = self._prefill_first_seen.get(key, (t, done))
            seen[key] = first
            remaining = max(0, total - done)
            eta: float | None
            if remaining == 0:
                eta = 0.0
            elif k > 0 and mean_round is not None:
                eta = math.ceil(remaining / k) * mean_round
            elif t > first[0] and done > first[1]:
                eta = remaining / ((done - first[1]) / (t - first[0]))
            else:
                eta = None
            views.append(PrefillView(p.request_ids, p.tokens, done, total, k, eta))
        self._prefill_first_seen = seen
        self.prefills = views

    def _on_request(self, r: RequestRecord) -> None:
        if r.kind == "arrival":
            self.arrivals += 1
        elif r.kind == "first_token":
            self.first_tokens += 1
            if r.ttft_s is not None:
                self.ttfts.append(r.ttft_s)
        elif r.kind == "finish":
            self.finished += 1
            self.itls.extend(r.itls_s)

    def _on_config(self, change: ConfigEvent) -> None:
        self._set_config(change.config)
        self.config_changes.append(change)

    def _on_hw(self, hw: Hw) -> None:
        self.hw = hw

    def _on_dropped(self, dropped: Dropped) -> None:
        self.dropped += dropped.count

    def _on_error(self, error: ErrorNotice) -> None:
        self.errors.append(error)

    def _on_seek(self, seek: Seek) -> None:
        """A replay moved: drop what was accumulated, take the configuration in force there."""
        self.reset_series()
        self._set_config(seek.config)

    def reset_series(self) -> None:
        """Forget the rolling buffers (after a replay seek or when a new engine starts)."""
        self.rounds.clear()
        self.ttfts.clear()
        self.itls.clear()
        self.prefills = []
        self._prefill_first_seen = {}
        self.version += 1

    # ---- derived figures (read on the tick) -------------------------------------------------

    def window(self) -> list[RoundPoint]:
        """Rounds in the last `window_s` seconds of engine time (cached until the next event)."""
        if self._window_cache[0] == self.version:
            return self._window_cache[1]
        out = self._compute_window()
        self._window_cache = (self.version, out)
        return out

    def _compute_window(self) -> list[RoundPoint]:
        if not self.rounds:
            return []
        start = self.rounds[-1].time - self.window_s
        out: list[RoundPoint] = []
        for r in reversed(self.rounds):
            if r.time < start:
                break
            out.append(r)
        out.reverse()
        return out

    def mean_round_s(self, last: int = 32) -> float | None:
        n = min(last, len(self.rounds))
        if n == 0:
            return None
        total = sum(self.rounds[-i].round_s for i in range(1, n + 1))
        return total / n

    def itl_summary(self, rounds: list[RoundPoint] | None = None) -> tuple[float | None, float | None, float | None]:
        """(p50, p99, max) of per-round decode step time over the window (rounds that decoded)."""
        rounds = self.window() if rounds is None else rounds
        return summary(r.decode_step_s for r in rounds if r.decode_bs > 0)

    def itl_series(self, buckets: int, rounds: list[RoundPoint] | None = None) -> list[float | None]:
        """Worst decode step per time slice across the window, oldest first."""
        rounds = self.window() if rounds is None else rounds
        start, end = self._slices(buckets, rounds)
        pts = [(r.time, r.decode_step_s) for r in rounds if r.decode_bs > 0]
        return bucket_max(pts, start, end, buckets)

    def _slices(self, buckets: int, rounds: list[RoundPoint]) -> tuple[float, float]:
        """The charts' time range: `window_s` ending at the slice boundary after the latest round.

        Slice edges sit on multiples of the slice width, so a column keeps its rounds as time
        moves on (only the newest column changes until the next slice starts).
        """
        if not rounds or buckets <= 0:
            return 0.0, self.window_s
        width = self.window_s / buckets
        end = (math.floor(self.time / width) + 1) * width
        return end - self.window_s, end

    def bandwidth(self, rounds: list[RoundPoint] | None = None) -> tuple[float | None, float | None]:
        """(average over the window, last round) of estimated bytes/s: bytes_moved / round time."""
        rounds = self.window() if rounds is None else rounds
        busy = sum(r.round_s for r in rounds)
        avg = sum(r.bytes_moved for r in rounds) / busy if busy > 0 else None
        last = rounds[-1] if rounds else None
        last_bps = last.bytes_moved / last.round_s if last and last.round_s > 0 else None
        return avg, last_bps

    def bandwidth_series(self, buckets: int, rounds: list[RoundPoint] | None = None) -> list[float | None]:
        rounds = self.window() if rounds is None else rounds
        start, end = self._slices(buckets, rounds)
        pts = [(r.time, r.bytes_moved / r.round_s) for r in rounds if r.round_s > 0]
        return bucket_max(pts, start, end, buckets)

    def tokens_per_s(self, rounds: list[RoundPoint] | None = None) -> float | None:
        """Output tokens per second of engine time over the window."""
        rounds = self.window() if rounds is None else rounds
        busy = sum(r.round_s for r in rounds)
        return sum(r.tokens for r in rounds) / busy if busy > 0 else None

    def ttft_summary(self, last: int = 512) -> tuple[float | None, float | None]:
        """(p50, p99) of time to first token over the latest `last` requests."""
        values = list(self.ttfts)[-last:]
        p50, p99, _ = summary(values)
        return p50, p99

    def pooled_itl_summary(self, last: int = 4096) -> tuple[float | None, float | None, float | None]:
        """(p50, p99, max) of per-request inter-token gaps from finished requests."""
        return summary(list(self.itls)[-last:])

    @property
    def kv_usage(self) -> float | None:
        return self.kv_used / self.kv_capacity if self.kv_capacity else None

    @property
    def levels(self) -> list[tuple[int, int]]:
        """The device's split levels (prefill units, decode units); index = level."""
        return self.config.levels if self.config is not None else []


_HANDLERS: dict[type, Callable[[DashboardState, Any], None]] = {
    Hello: DashboardState._on_hello,
    RoundRecord: DashboardState._on_round,
    RequestRecord: DashboardState._on_request,
    ConfigEvent: DashboardState._on_config,
    Hw: DashboardState._on_hw,
    Dropped: DashboardState._on_dropped,
    ErrorNotice: DashboardState._on_error,
    Seek: DashboardState._on_seek,
}
