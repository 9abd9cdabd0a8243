"""An SGLang server's PD-multiplexing split, read from its log lines.

SGLang (`python/sglang/srt/multiplex/multiplexing_mixin.py`) logs, at start-up (info):

    PD-Multiplexing enabled with 8 stream groups, sm_counts (prefill_sm, decode_sm): [(132, 0), (112, 20), ...]

and at every level change (debug, `--log-level debug`):

    Adjusting stream groups: 3, prefill sm: 88, decode sm: 44

Each line carries SGLang's prefix, `[2026-12-01 10:00:01 TP0] ` (newer SGLang: `[12-01 10:00:01 DP0 TP0] `,
maybe coloured). Only the first rank's lines count: a tag `TPn`, `DPn`, `PPn`, ... with n > 0 is another
rank's. A new start-up line is a restarted server: its levels replace the old ones.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX = re.compile(r"^\[(?P<time>[^\]]*?)(?P<tags>(?: [A-Z]{2,4}\d+)*)\] ?(?P<message>.*)$")
_TAG = re.compile(r"[A-Z]{2,4}(\d+)")
_START = re.compile(r"PD-Multiplexing enabled with (?P<n>\d+) stream groups, "
                    r"sm_counts \(prefill_sm, decode_sm\): (?P<counts>\[.*\])")
_PAIR = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_ADJUST = re.compile(r"Adjusting stream groups: (?P<level>\d+), prefill sm: (?P<p>\d+), decode sm: (?P<d>\d+)")
MAX_LEVELS = 256  # SGLang's sm_group_num is far below; a longer list is not SGLang's line
MAX_SMS = 1 << 16


def first_rank_message(line: str) -> str | None:
    """The message of a line of the first rank (or of a line with no rank tags); None for another rank's."""
    line = _ANSI.sub("", line).rstrip("\r\n")
    match = _PREFIX.match(line)
    if match is None:
        return line
    if any(int(n) != 0 for n in _TAG.findall(match.group("tags"))):
        return None
    return match.group("message")


@dataclass
class LogSplit:
    """What the log said so far: the levels of the latest start-up, the level in force, and the seconds
    spent at each level (from when each `Adjusting` line was read to the next)."""

    levels: list[tuple[int, int]] = field(default_factory=list)  # (prefill SMs, decode SMs); index = level
    level: int | None = None  # from the latest `Adjusting stream groups` line since the start-up
    prefill_sm: int | None = None
    decode_sm: int | None = None
    level_time_s: dict[int, float] = field(default_factory=dict)  # seconds at each level, since the start-up
    starts: int = 0  # start-up lines read (more than one: the server restarted)
    changes: int = 0  # level changes read since the start-up
    lines: int = 0  # the first rank's lines read
    _since: float | None = None  # when the level in force was read

    def feed(self, line: str, now: float) -> bool:
        """Take one log line read at `now` (seconds, any clock); True if it changed the split."""
        message = first_rank_message(line)
        if message is None:
            return False
        self.lines += 1
        if "PD-Multiplexing enabled" in message:
            return self._start(message)
        if "Adjusting stream groups" in message:
            return self._adjust(message, now)
        return False

    def _start(self, message: str) -> bool:
        match = _START.search(message)
        if match is None:
            return False
        pairs = [(int(p), int(d)) for p, d in _PAIR.findall(match.group("counts"))]
        if not pairs or len(pairs) > MAX_LEVELS or any(p + d > MAX_SMS for p, d in pairs):
            return False
        self.levels, self.level, self.prefill_sm, self.decode_sm = pairs, None, None, None
        self.level_time_s, self.changes, self._since = {}, 0, None
        self.starts += 1
        return True

    def _adjust(self, message: str, now: float) -> bool:
        match = _ADJUST.search(message)
        if match is None:
            return False
        level, p, d = int(match.group("level")), int(match.group("p")), int(match.group("d"))
        if level >= MAX_LEVELS or p + d > MAX_SMS:
            return False
        self._account(now)
        self.level, self.prefill_sm, self.decode_sm = level, p, d
        self.changes += 1
        return True

    def _account(self, now: float) -> None:
        if self.level is not None and self._since is not None:
            self.level_time_s[self.level] = self.level_time_s.get(self.level, 0.0) + max(0.0, now - self._since)
        self._since = now

    def times(self, now: float) -> list[float]:
        """Seconds at each level of `levels` since the start-up, the level in force counted up to `now`."""
        self._account(now)
        return [round(self.level_time_s.get(i, 0.0), 3) for i in range(len(self.levels))]

    @property
    def sms(self) -> int | None:
        """The device's SM count: what a level gives both sides together (the whole-device levels)."""
        return max(p + d for p, d in self.levels) if self.levels else None
