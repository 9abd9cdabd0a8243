"""What the dashboard keeps of a scraped `/metrics` page (`pdtop attach http://...`): the target from
`hello.scrape`, the latest `metrics` event, and the latency percentiles over time for the ITL chart.

A figure the server does not expose is None here and shown as "not exposed by this engine", never as 0;
one that was not a finite number ("NaN", "+Inf") is kept as that word. The target's words came from the
server (its labels) or a recording: they are kept with their control characters made visible.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from pdtop.telemetry.events import Metrics, ScrapeTarget
from pdtop.telemetry.scrape.names import ENGINE_NAMES, FIELDS
from pdtop.visible import visible

NOT_EXPOSED = "not exposed by this engine"


@dataclass(slots=True)
class LatencyPoint:
    """One read's p99s over the window, for the charts (None: not exposed, nothing observed, or not finite)."""

    time: float
    itl_p99_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None


@dataclass(slots=True)
class SplitPoint:
    """One read's split (an SGLang server with --sglang-log / --pdmux-config), for the level table."""

    time: float
    level: int | None
    level_time_s: list[float]  # cumulative, from the log; empty when inferred
    starts: int
    itl_read_p50_s: float | None  # ITL p50 of the gaps since the previous read


@dataclass
class ScrapeView:
    target: ScrapeTarget
    latest: Metrics | None = None
    history: deque[LatencyPoint] = field(default_factory=lambda: deque(maxlen=4096))
    scrapes: int = 0
    splits: deque[SplitPoint] = field(default_factory=lambda: deque(maxlen=4096))

    def __post_init__(self) -> None:
        t = self.target
        self.target = replace(t, url=visible(t.url, 300), engine=visible(t.engine, 20),
                              model_name=visible(t.model_name, 300) if t.model_name is not None else None,
                              models=[visible(m, 300) for m in t.models])

    @property
    def engine_name(self) -> str:
        return ENGINE_NAMES.get(self.target.engine, self.target.engine)

    @property
    def model_line(self) -> str:
        """The model shown, and which of several it is."""
        t = self.target
        if t.model_name is None:
            return "(no model_name label)"
        if len(t.models) > 1:
            return f"{t.model_name} ({t.models.index(t.model_name) + 1} of {len(t.models)} models, --model-name)"
        return t.model_name

    def take(self, m: Metrics) -> None:
        if self.history and m.time < self.history[-1].time:
            self.history.clear()  # a replay went back
        self.latest = m
        self.scrapes += 1
        point = LatencyPoint(m.time, *(number(q.p99_s) if q is not None else None for q in (m.itl, m.ttft, m.e2e)))
        if self.history and self.history[-1].time == m.time:  # read at the same time: it replaces the last
            self.history[-1] = point
        else:
            self.history.append(point)
        if m.split is not None:
            if self.splits and m.time < self.splits[-1].time:
                self.splits.clear()
            self.splits.append(SplitPoint(m.time, m.split.level, list(m.split.level_time_s), m.split.starts,
                                          number(m.itl_read_p50_s)))

    def exposed(self, name: str) -> bool:
        return self.latest is not None and name not in self.latest.not_exposed

    @property
    def log_only(self) -> bool:
        """Every figure of the latest read came from SGLang's log: there is no /metrics page."""
        m = self.latest
        return m is not None and m.log is not None and all(f in m.log.fields for f in FIELDS if self.exposed(f))

    def copy(self) -> ScrapeView:
        return ScrapeView(self.target, self.latest, deque(self.history, maxlen=self.history.maxlen), self.scrapes,
                          deque(self.splits, maxlen=self.splits.maxlen))


def number(value: float | str | None) -> float | None:
    """A finite figure, else None (the chart leaves a gap)."""
    return value if isinstance(value, float | int) else None
