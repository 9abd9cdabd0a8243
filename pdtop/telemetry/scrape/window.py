"""Counter increases over a recent window of scrapes, as Prometheus's `increase` sees them.

Each series (a sample name with all its labels) is corrected for resets the way Prometheus does: a
value below the previous one means the counter started again from zero (a restarted server), so the
previous value is added to it and to everything after. A series' increase runs from the oldest scrape
in the window that had it (without a gap since) to the latest. Prometheus also extrapolates to the
window's edges; that scales every bucket of a histogram alike, so percentiles do not change, and
rates here are the increase over the time the scrapes really span.

What the window holds is bounded in bytes (`MAX_BYTES`): a page whose labels change on every read makes
every scrape's series new, and 30 s of reads every 50 ms of a 4 MiB page would be gigabytes. Past the
bound the oldest scrapes go first, so the window then spans less time (`span_s` says how much).
"""
from __future__ import annotations

from collections import deque

Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels
MAX_BYTES = 64 << 20  # series text held over the window; a busy vLLM page's counters are ~50 KB a read
_ENTRY_BYTES = 200  # a key's tuples and the value's float beside its text (sys.getsizeof)


class Window:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._raw: dict[Key, float] = {}  # each series' value at the latest scrape
        self._offset: dict[Key, float] = {}  # added for the resets seen
        self._since: dict[Key, float] = {}  # when each series' current unbroken run began
        self._scrapes: deque[tuple[float, dict[Key, float]]] = deque()  # (time, corrected values)
        self._costs: deque[int] = deque()  # bytes of each scrape's series
        self.bytes = 0

    def add(self, t: float, values: dict[Key, float]) -> int:
        """Take one scrape's counters (at time `t`, seconds); returns how many series went back."""
        resets = 0
        corrected: dict[Key, float] = {}
        offsets: dict[Key, float] = {}
        since: dict[Key, float] = {}
        cost = 0  # bytes this scrape holds: a series new since the previous scrape brings its own strings
        for key, value in values.items():
            last = self._raw.get(key)
            cost += _ENTRY_BYTES if last is not None else \
                _ENTRY_BYTES + len(key[0]) + sum(len(k) + len(v) for k, v in key[1])
            offset = self._offset.get(key, 0.0) if last is not None else 0.0  # a series back from a gap is new
            if last is not None and value < last:
                offset += last
                resets += 1
            offsets[key], corrected[key] = offset, value + offset
            since[key] = self._since.get(key, t) if last is not None else t
        self._raw, self._offset, self._since = dict(values), offsets, since
        self._scrapes.append((t, corrected))
        self._costs.append(cost)
        self.bytes += cost
        start = t - self.window_s  # keep the newest scrape at or before the window's start as its base
        while len(self._scrapes) > 1 and (self._scrapes[1][0] <= start or self.bytes > MAX_BYTES):
            self._scrapes.popleft()
            self.bytes -= self._costs.popleft()
        return resets

    @property
    def span_s(self) -> float:
        """Seconds from the window's oldest scrape to the latest (0 after the first)."""
        return self._scrapes[-1][0] - self._scrapes[0][0] if self._scrapes else 0.0

    def increase(self, key: Key) -> float:
        """The series' increase over the window (0 for a series the latest scrape lacks)."""
        if not self._scrapes:
            return 0.0
        latest = self._scrapes[-1][1]
        if key not in latest:
            return 0.0
        since = self._since[key]
        for t, values in self._scrapes:
            if t >= since and key in values:
                return latest[key] - values[key]
        return 0.0

    def increase_last(self, key: Key) -> float:
        """The series' increase since the previous scrape alone (0 after the first, or for a new series)."""
        if len(self._scrapes) < 2:
            return 0.0
        (_, before), (t, latest) = self._scrapes[-2], self._scrapes[-1]
        if key not in latest or key not in before or self._since[key] >= t:
            return 0.0
        return latest[key] - before[key]
