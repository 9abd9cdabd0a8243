"""The dashboard's state, filled from event dicts (live or replayed: the same events).

`DashboardState.ingest` is cheap (keep the latest values, append to bounded buffers),
so events are taken at full rate; panels read the derived figures on the repaint tick.
Nothing here imports Textual, so the model is tested with plain event dicts.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

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
    """What `hello` says about the engine (its `Engine.describe()`)."""

    model: str = "?"
    device: str = "?"
    unit_name: str = "units"
    units: int = 0
    levels: list[tuple[int, int]] = field(default_factory=list)
    policy: str = "?"
    peak_bytes_per_s: float | None = None

    @classmethod
    def from_describe(cls, d: dict[str, Any]) -> "EngineInfo":
        device = d.get("device", "?")
        dev = device if isinstance(device, dict) else {}
        model = d.get("model", "?")
        if isinstance(model, dict):
            model = model.get("name", "?")
        return cls(
            model=str(model),
            device=str(dev.get("name", "?") if dev else device),
            unit_name=str(d.get("unit_name") or dev.get("unit_name") or "units"),
            units=int(d.get("units") or dev.get("units") or 0),
            levels=_levels(d.get("levels") or dev.get("levels") or []),
            policy=str(d.get("policy", "?")),
            peak_bytes_per_s=_peak_bandwidth(d),
        )


def _levels(raw: Any) -> list[tuple[int, int]]:
    return [(int(p), int(q)) for p, q in raw]


def _peak_bandwidth(d: dict[str, Any]) -> float | None:
    """The device's peak memory bandwidth in bytes/s, if `describe()` gives one."""
    for src in (d, d.get("device") if isinstance(d.get("device"), dict) else {}, d.get("spec") or {}):
        for key, scale in (("peak_bw", 1.0), ("peak_bandwidth", 1.0), ("peak_bandwidth_gbs", 1e9)):
            value = src.get(key) if isinstance(src, dict) else None
            if isinstance(value, (int, float)) and value > 0:
                return float(value) * scale
    return None


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
    config: dict[str, Any] = field(default_factory=dict)
    recording: str | None = None  # path being recorded to, when the server says so

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
    config_changes: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=64))
    errors: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=64))
    dropped: int = 0
    hw: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    version: int = 0  # bumped by every ingested event; the tick repaints when it moved

    itl_slo_s: float | None = None  # the operator's ITL SLO line (a dashboard setting)
    _prefill_first_seen: dict[tuple[int, ...], tuple[float, int]] = field(default_factory=dict, repr=False)
    _window_cache: tuple[int, list[RoundPoint]] = field(default=(-1, []), repr=False)

    def __post_init__(self) -> None:
        self.rounds = deque(self.rounds, maxlen=self.max_rounds)
        self.ttfts = deque(self.ttfts, maxlen=self.max_requests)
        self.itls = deque(self.itls, maxlen=self.max_requests * 8)

    # ---- ingest -------------------------------------------------------------------------

    def ingest(self, ev: dict[str, Any]) -> None:
        """Take one event dict of the envelope (`type`, `v`, ...); unknown types are ignored."""
        handler = _HANDLERS.get(ev.get("type"))  # type: ignore[arg-type]
        self.events += 1
        if handler is not None:
            handler(self, ev)
            self.version += 1

    def _on_hello(self, ev: dict[str, Any]) -> None:
        self.hello = True
        self.client_id = ev.get("client_id")
        self.readonly = bool(ev.get("readonly", False))
        self.server_version = ev.get("pdtop")
        engine = ev.get("engine") or {}
        self.info = EngineInfo.from_describe(engine)
        self.config = dict(engine.get("config") or {})
        self.policy = self.info.policy
        if "recording" in ev:
            rec = ev["recording"]
            self.recording = (rec.get("path") if isinstance(rec, dict) else rec) or None

    def _on_round(self, ev: dict[str, Any]) -> None:
        t = float(ev.get("time", 0.0))
        if self.rounds and t < self.rounds[-1].time:
            self.reset_series()  # the clock went back: a new engine, or a replay seek
        self.rounds_seen += 1
        self.round_index = int(ev.get("index", self.round_index + 1))
        self.time = t
        self.policy = ev.get("policy", self.policy)
        self.level = ev.get("level")
        self.pinned = bool(ev.get("pinned", False))
        self.prefill_units = int(ev.get("prefill_units", 0))
        self.decode_units = int(ev.get("decode_units", 0))
        self.decode_bs = int(ev.get("decode_bs", 0))
        self.waiting = int(ev.get("waiting", 0))
        self.running = int(ev.get("running", 0))
        self.kv_used = int(ev.get("kv_used_tokens", 0))
        self.kv_capacity = int(ev.get("kv_capacity_tokens", 0))
        step = float(ev.get("decode_step_s", 0.0))
        round_s = float(ev.get("round_s", 0.0))
        self.rounds.append(RoundPoint(t, step, round_s, float(ev.get("bytes_moved", 0.0)),
                                      int(ev.get("tokens_emitted", 0)), self.decode_bs))
        self._update_prefills(ev.get("prefills") or [], t)

    def _update_prefills(self, raw: list[dict[str, Any]], t: float) -> None:
        seen: dict[tuple[int, ...], tuple[float, int]] = {}
        views: list[PrefillView] = []
        mean_round = self.mean_round_s()
        for p in raw:
            ids = [int(i) for i in p.get("request_ids", [])]
            key = tuple(ids)
            done, total = int(p.get("layers_done", 0)), int(p.get("layers_total", 0))
            k = int(p.get("layers_per_round", 0))
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
            views.append(PrefillView(ids, int(p.get("tokens", 0)), done, total, k, eta))
        self._prefill_first_seen = seen
        self.prefills = views

    def _on_request(self, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if kind == "arrival":
            self.arrivals += 1
        elif kind == "first_token":
            self.first_tokens += 1
            if ev.get("ttft_s") is not None:
                self.ttfts.append(float(ev["ttft_s"]))
        elif kind == "finish":
            self.finished += 1
            self.itls.extend(float(x) for x in ev.get("itls_s") or ())

    def _on_config(self, ev: dict[str, Any]) -> None:
        if isinstance(ev.get("config"), dict):
            self.config = dict(ev["config"])
        changes = ev.get("changes") or {}
        self.config_changes.append({"time": ev.get("time"), "changes": changes, "client": ev.get("client")})
        if "policy" in self.config:
            self.policy = str(self.config["policy"])
        levels = ev.get("levels") or self.config.get("levels")
        if levels:
            self.info.levels = _levels(levels)

    def _on_hw(self, ev: dict[str, Any]) -> None:
        self.hw = {k: v for k, v in ev.items() if k not in ("type", "v")}

    def _on_dropped(self, ev: dict[str, Any]) -> None:
        self.dropped += int(ev.get("count", 0))

    def _on_error(self, ev: dict[str, Any]) -> None:
        self.errors.append((str(ev.get("field", "")), str(ev.get("reason", ""))))

    def _on_seek(self, ev: dict[str, Any]) -> None:
        """A replay moved to `position`: drop what was accumulated, take the config in force there."""
        self.reset_series()
        if isinstance(ev.get("config"), dict) and ev["config"]:
            self.config = dict(ev["config"])
            if "policy" in self.config:
                self.policy = str(self.config["policy"])
            if self.config.get("levels"):
                self.info.levels = _levels(self.config["levels"])

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
        return self.info.levels


_HANDLERS = {
    "hello": DashboardState._on_hello,
    "round": DashboardState._on_round,
    "request": DashboardState._on_request,
    "config": DashboardState._on_config,
    "hw": DashboardState._on_hw,
    "dropped": DashboardState._on_dropped,
    "error": DashboardState._on_error,
    "seek": DashboardState._on_seek,
}
