"""The dashboard's state, filled from events (live or replayed: the same events).

`DashboardState.ingest` decodes each received event once (`decode_event`: a field that is
missing or of the wrong type is refused, never read as 0) and keeps the latest values and
appends to bounded buffers, so it is cheap and events are taken at full rate; panels read
the derived figures on the repaint tick. Nothing here imports Textual, so the model is
tested with plain event dicts.

The metrics are named and defined as in vLLM's serving benchmark:
- decode step time: how long a round's decode forward took (`decode_step_s`), per round;
- ITL: the gap between two consecutive tokens of a request (per token);
- TPOT: a request's time per output token after the first, (end - first token) / (tokens - 1),
  which is the mean of its ITLs;
- output throughput: output tokens / elapsed time (not busy time).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.description import EngineConfig
from pdtop.engine.records import DisaggState, KvTransfer, PrefillProgress, RequestRecord, RoundRecord
from pdtop.telemetry.decode import EventError, UnknownEventType, decode_event
from pdtop.telemetry.events import (
    ConfigEvent,
    Dropped,
    ErrorNotice,
    Event,
    Fleet,
    Hello,
    Hw,
    Metrics,
    Seek,
)
from pdtop.telemetry.round_gaps import RoundGaps
from pdtop.ui.engine_info import EngineInfo
from pdtop.ui.fleet_view import FleetView, on_fleet
from pdtop.ui.prefill_view import PrefillView, prefill_views
from pdtop.ui.scrape_view import ScrapeView
from pdtop.ui.stats import summary
from pdtop.ui.window_figures import RoundPoint


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
    recording: str | None = None  # the file the server records to (hello.recording, or this dashboard's R)
    recording_known: bool = False  # false: the server does not say (one before hello.recording)
    api: str | None = None  # the server's OpenAI-compatible API (hello.api)
    scrape: ScrapeView | None = None  # a scraped /metrics page (hello.scrape): the panels show it instead
    fleet: FleetView | None = None  # several pages (hello.fleet): `scrape` is the selected server's

    # the latest round
    rounds_seen: int = 0
    round_index: int = -1
    time: float = 0.0
    policy: str = "?"
    level: int | None = None
    pinned: bool = False
    prefill_units: int = 0
    decode_units: int = 0
    predicted_steps_s: list[float | None] | None = None  # level_rule slo: the model's step per level
    decode_bs: int = 0
    waiting: int = 0
    running: int = 0
    idle: bool = False
    kv_used: int = 0
    kv_capacity: int = 0
    prefills: list[PrefillView] = field(default_factory=list)
    disagg: DisaggState | None = None  # under disagg: the prefill instance and the link (the latest round's)
    transfers: deque[KvTransfer] = field(default_factory=lambda: deque(maxlen=256))  # the latest KV transfers
    shown_level: int | None = None  # the level on screen at the last repaint: what + and - step from
    # the level + or - last pinned, until the screen shows it or it is refused: a second press before the
    # engine's next round steps from it (three quick presses are three levels, not one)
    pending_level: int | None = None

    rounds: deque[RoundPoint] = field(default_factory=deque)
    ttfts: deque[float] = field(default_factory=deque)
    itls: deque[float] = field(default_factory=deque)
    tpots: deque[float] = field(default_factory=deque)
    # request counts since `counts_since` ("engine start" from hello's totals, else "connect" or "seek")
    arrivals: int = 0
    first_tokens: int = 0
    finished: int = 0
    rejected: int = 0
    counts_since: str = "connect"
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
    levels_since: float = float("-inf")  # engine time the levels in force came in: the level table counts from it
    _prefill_first_seen: dict[tuple[int, ...], tuple[float, int]] = field(default_factory=dict, repr=False)
    _gaps: RoundGaps = field(default_factory=RoundGaps, repr=False)  # the decode batch's ITL, round by round
    _window_cache: tuple[int, list[RoundPoint]] = field(default=(-1, []), repr=False)

    def __post_init__(self) -> None:
        self.rounds = deque(self.rounds, maxlen=self.max_rounds)
        self.ttfts = deque(self.ttfts, maxlen=self.max_requests)
        self.itls = deque(self.itls, maxlen=self.max_requests * 8)
        self.tpots = deque(self.tpots, maxlen=self.max_requests)

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
        self.api = hello.api
        self.recording_known = hello.recording is not None
        self.recording = hello.recording.path if hello.recording is not None else None
        self.fleet = FleetView(hello.fleet) if hello.fleet is not None else None
        if hello.engine is None and hello.fleet is not None:
            self.scrape, self.config, self.policy = None, None, "?"
            self.info = EngineInfo(model="fleet", device="fleet")
            return
        if hello.engine is None:  # a /metrics page: no engine description, no configuration, no rounds
            target = hello.scrape
            assert target is not None  # decode_event refuses a hello with neither
            prev, self.scrape = self.scrape, ScrapeView(target)
            shown = self.scrape.target  # its words made visible
            if prev is not None and (prev.target.engine, prev.target.model_name) == (shown.engine, shown.model_name):
                self.scrape.history = prev.history  # the same server back: its chart goes on
            self.info = EngineInfo(model=shown.model_name or "?", device=self.scrape.engine_name)
            self.config, self.policy = None, "?"
            self.reset_series()
            self._set_counts(0, 0, 0, 0, "connect")
            return
        self.scrape = None
        self.info = EngineInfo.from_engine(hello.engine)
        self._set_config(hello.engine.config)
        totals = hello.engine.totals  # the server's counts: nothing carries over from another connection
        if totals is not None:
            self._set_counts(totals.arrived, totals.first_token, totals.finished, totals.rejected, "engine start")
        else:
            self._set_counts(0, 0, 0, 0, "connect")

    def _set_counts(self, arrived: int, first_token: int, finished: int, rejected: int, since: str) -> None:
        self.arrivals, self.first_tokens, self.finished, self.rejected = arrived, first_token, finished, rejected
        self.counts_since = since

    def _set_config(self, config: EngineConfig) -> None:
        if self.config is not None and self.config.levels != config.levels:
            self.levels_since = self.time  # another table: no earlier round ran on these levels
        self.config = config
        self.policy = config.policy

    def _on_round(self, r: RoundRecord) -> None:
        self.rounds_seen += 1
        if r.instance == "prefill":  # disagg's prefill instance: its state also rides on the decode rounds
            return
        t = r.time
        last = self.rounds[-1] if self.rounds else None
        if last is not None and t < last.time:
            self.reset_series()  # the clock went back: a new engine, or a replay seek
            last = None
        follows = last is not None and r.index == last.index + 1  # no round missed in between
        self.round_index = r.index
        self.time = t
        self.policy = r.policy
        self.level = r.level
        self.pinned = r.pinned
        self.prefill_units = r.prefill_units
        self.decode_units = r.decode_units
        self.predicted_steps_s = r.predicted_steps_s
        self.decode_bs = r.decode_bs
        self.waiting = r.waiting
        self.running = r.running
        self.idle = r.decode_bs == 0 and not r.prefills and r.waiting == 0 and r.running == 0
        self.kv_used = r.kv_used_tokens
        self.kv_capacity = r.kv_capacity_tokens
        self.disagg = r.disagg
        itl = self._gaps.after(follows, t, r.decode_bs, r.running)
        if itl is not None:  # every request in the batch waited this gap for its token
            self.itls.extend(itertools.repeat(itl, RoundGaps.repeats(r.decode_bs)))
        self._update_prefills(r.prefills, t)
        first = r.prefills[0] if r.prefills else None
        self.rounds.append(RoundPoint(
            r.index, t, t - last.time if follows and last is not None else r.round_s, r.decode_step_s, r.round_s,
            r.bytes_moved, r.tokens_emitted, r.decode_bs, r.level, r.prefill_units, r.decode_units, self.idle, itl,
            tuple(first.request_ids) if first else (),
            min(1.0, (first.layers_done + first.layers_per_round) / first.layers_total)
            if first and first.layers_total else 0.0, r.disagg.transfer_bytes if r.disagg else 0))

    def _update_prefills(self, progress: list[PrefillProgress], t: float) -> None:
        """The prefill views after this round, with their ETAs."""
        chunk = self.config.chunk_size if self.config is not None else None
        pdmux_chunk = (self.config.chunked_prefill_size or 0) if self.config is not None else 0
        self.prefills, self._prefill_first_seen = prefill_views(progress, t, self._prefill_first_seen,
                                                                self.mean_round_s(), chunk, pdmux_chunk)

    def _on_request(self, r: RequestRecord) -> None:
        if r.kind == "arrival":
            self.arrivals += 1
        elif r.kind == "first_token":
            self.first_tokens += 1
            if r.ttft_s is not None:
                self.ttfts.append(r.ttft_s)
        elif r.kind == "finish":
            if r.finish_reason == "rejected":
                self.rejected += 1
                return
            self.finished += 1
            if r.itls_s:  # TPOT = (end - first token) / (tokens - 1): the mean of its gaps
                self.tpots.append(sum(r.itls_s) / len(r.itls_s))

    def _on_transfer(self, t: KvTransfer) -> None:
        self.transfers.append(t)

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
        """A replay moved: forget everything of the position before (what a fresh replay at the new one has
        not seen), take the configuration in force there and the counts as the window replayed next starts."""
        self.reset_series()
        self.config_changes.clear()
        for f in _AT_A_POSITION:
            setattr(self, f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        if seek.config is not None:
            self._set_config(seek.config)
        if seek.totals is not None:  # the recording's hello's totals on: the label it gave them stays
            t = seek.totals
            self._set_counts(t.arrived, t.first_token, t.finished, t.rejected, self.counts_since)
        else:
            self._set_counts(0, 0, 0, 0, "seek")
        self.dropped = seek.dropped or 0

    def _on_metrics(self, m: Metrics) -> None:
        if self.scrape is not None:  # (a metrics event without its hello is ignored)
            self.scrape.take(m)

    def reset_series(self) -> None:
        """Forget the rolling buffers (after a replay seek or when a new engine starts)."""
        self.rounds.clear()
        self.ttfts.clear()
        self.itls.clear()
        self.tpots.clear()
        self.transfers.clear()
        self.prefills = []
        self._prefill_first_seen = {}
        self._gaps = RoundGaps()
        self.levels_since = float("-inf")
        if self.scrape is not None:
            self.scrape.history.clear()
        self.version += 1

    def snapshot(self) -> DashboardState:
        """A copy that later events do not change (a frozen screen); the buffers are copied, their
        points shared (they are never changed once appended)."""
        twin = copy.copy(self)
        for name in ("rounds", "ttfts", "itls", "tpots", "config_changes", "errors", "transfers"):
            buffer = getattr(self, name)
            setattr(twin, name, deque(buffer, maxlen=buffer.maxlen))
        twin.prefills = list(self.prefills)
        twin.scrape = self.scrape.copy() if self.scrape is not None else None
        twin.fleet = self.fleet.copy() if self.fleet is not None else None
        twin._window_cache = (-1, [])
        twin._gaps = dataclasses.replace(self._gaps)
        return twin

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

    def last_rounds(self, n: int) -> list[RoundPoint]:
        """The latest `n` rounds, oldest first (the timeline)."""
        n = min(n, len(self.rounds))
        return [self.rounds[i] for i in range(len(self.rounds) - n, len(self.rounds))]

    def mean_round_s(self, last: int = 32) -> float | None:
        n = min(last, len(self.rounds))
        if n == 0:
            return None
        total = sum(self.rounds[-i].round_s for i in range(1, n + 1))
        return total / n

    def slices(self, buckets: int) -> tuple[float, float]:
        """The charts' time range: `window_s` ending at the slice boundary after the latest round.

        Slice edges sit on multiples of the slice width, so a column keeps its rounds as time
        moves on (only the newest column changes until the next slice starts).
        """
        if not self.rounds or buckets <= 0:
            return 0.0, self.window_s
        width = self.window_s / buckets
        end = (math.floor(self.time / width) + 1) * width
        return end - self.window_s, end

    def ttft_summary(self, last: int = 512) -> tuple[float | None, float | None]:
        """(p50, p99) of time to first token over the latest `last` requests."""
        p50, p99, _ = summary(list(self.ttfts)[-last:])
        return p50, p99

    def itl_summary(self, last: int = 4096) -> tuple[float | None, float | None, float | None]:
        """(p50, p99, max) of ITL: the latest `last` gaps between consecutive tokens of any request, from
        the rounds (a decode round's gap once per request in its batch), so it fills from the second
        decode round, not once requests finish."""
        return summary(list(self.itls)[-last:])

    def tpot_summary(self, last: int = 512) -> tuple[float | None, float | None]:
        """(p50, p99) of TPOT over the latest `last` finished requests."""
        p50, p99, _ = summary(list(self.tpots)[-last:])
        return p50, p99

    @property
    def kv_usage(self) -> float | None:
        return self.kv_used / self.kv_capacity if self.kv_capacity else None

    @property
    def levels(self) -> list[tuple[int, int]]:
        """The device's split levels (prefill units, decode units); index = level."""
        return self.config.levels if self.config is not None else []


# what the latest round (and sample) set: a seek forgets it, as a fresh replay has not seen it
_AT_A_POSITION = [f for f in dataclasses.fields(DashboardState) if f.name in (
    "round_index", "time", "level", "pinned", "prefill_units", "decode_units", "predicted_steps_s", "decode_bs",
    "waiting", "running", "idle", "kv_used", "kv_capacity", "prefills", "disagg", "hw", "shown_level")]

_HANDLERS: dict[type, Callable[[DashboardState, Any], None]] = {
    Hello: DashboardState._on_hello,
    Fleet: on_fleet,
    RoundRecord: DashboardState._on_round,
    RequestRecord: DashboardState._on_request,
    KvTransfer: DashboardState._on_transfer,
    ConfigEvent: DashboardState._on_config,
    Hw: DashboardState._on_hw,
    Dropped: DashboardState._on_dropped,
    ErrorNotice: DashboardState._on_error,
    Seek: DashboardState._on_seek,
    Metrics: DashboardState._on_metrics,
}
