"""The split of an SGLang pdmux server, which its /metrics does not have: from its log (`--sglang-log`),
or inferred from its pdmux YAML (`--pdmux-config`) and the scraped batch.

The log is fact: the start-up line gives the levels, each `Adjusting stream groups` line the level in
force. Without such lines (SGLang logs them only with `--log-level debug`) and with the config, the
level is the one SGLang's `adjust_stream_groups` would pick for what /metrics shows: the running
requests as the decode batch, a prefill in flight when requests wait. That is labelled inferred.
The result is the `split` object of a `metrics` event (docs/protocol.md).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.telemetry.events import Metrics, ScrapedSplit
from pdtop.telemetry.scrape.sglang_log import LogSplit
from pdtop.telemetry.sources.log_follow import LogFollower

MAJOR_FOR_UNKNOWN = 9  # SGLang's pdmux runs on Hopper: a log's levels are already realized, so unused


class SglangSplit:
    def __init__(self, follower: LogFollower | None = None, config: PdmuxConfig | None = None,
                 sms: int | None = None, cc_major: int = MAJOR_FOR_UNKNOWN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`sms`: the device's SM count, for the config's levels when no log gives them."""
        self.follower, self.config, self.sms, self.cc_major, self.clock = follower, config, sms, cc_major, clock
        self.log = LogSplit()

    def poll(self) -> bool:
        """Read the log's new lines; True if the split changed."""
        if self.follower is None:
            return False
        now = self.clock()
        changed = False
        for line in self.follower.read_lines():
            changed |= self.log.feed(line, now)
        return changed

    def fields(self, read: Metrics) -> ScrapedSplit | None:
        """The `split` object for a read whose figures are `read`; None if nothing is known."""
        self.poll()
        log = self.log
        levels = list(log.levels) or self._config_levels(log.sms)
        note = self.follower.problem if self.follower is not None else None
        level: int | None = log.level
        p, d, inferred = log.prefill_sm, log.decode_sm, False
        if level is None:
            level = self._inferred_level(levels, read)
            p, d = levels[level] if level is not None else (None, None)
            inferred = level is not None
        source = "config" if inferred or (not log.levels and self.follower is None) else "log"
        if not levels and level is None:
            if self.follower is None:
                return None
            return ScrapedSplit("log", False, [], None, None, None, [], log.starts, note)
        return ScrapedSplit(source, inferred, list(levels), level, p, d,
                            log.times(self.clock()) if log.levels and not inferred else [], log.starts, note)

    def _config_levels(self, sms: int | None) -> list[tuple[int, int]]:
        total = sms or self.sms
        if self.config is None or total is None:
            return []
        return list(SplitTable.for_gpu(total, self.cc_major, self.config).groups)

    def _inferred_level(self, levels: list[tuple[int, int]], read: Metrics) -> int | None:
        running, waiting = read.running, read.waiting
        if self.config is None or not levels or not isinstance(running, float | int) or \
                not isinstance(waiting, float | int):
            return None
        table = SplitTable(levels, "SMs", bool(self.config.manual_divisions),
                           tuple(t for _, _, t in self.config.manual_divisions))
        if table.manual and len(table.thresholds) != len(levels) - 2:
            return None  # the log's levels are not this config's
        return table.choose(int(running), waiting > 0, self.config)

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
