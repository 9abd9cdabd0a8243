"""What an SGLang server's log (`--sglang-log`) and pdmux YAML (`--pdmux-config`) add to its /metrics
reads: the split, which /metrics does not have, and the batch figures, where /metrics lacks them.

The log is fact: the start-up line gives the levels, each `Adjusting stream groups` line the level in
force. Without such lines (SGLang logs them only with `--log-level debug`) and with the config, the
level is the one SGLang's `adjust_stream_groups` would pick for what /metrics shows: the running
requests as the decode batch, a prefill in flight when requests wait. That is labelled inferred.
The result is the `split` object of a `metrics` event (docs/protocol.md).

The scheduler's `Decode batch` / `Prefill batch` lines give running and waiting requests, KV use, token
throughput and the PD queues: they fill the figures a page lacks, or make the whole read when there is
no page (SGLang without `--enable-metrics`), and `metrics.log` says which they are and how old.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.telemetry.events import Disagg, LogFigures, Metrics, ScrapedSplit
from pdtop.telemetry.scrape.names import FIELDS
from pdtop.telemetry.scrape.sglang_log import SglangLog
from pdtop.telemetry.sources.log_follow import LogFollower

MAJOR_FOR_UNKNOWN = 9  # SGLang's pdmux runs on Hopper: a log's levels are already realized, so unused


class SglangSplit:
    def __init__(self, follower: LogFollower | None = None, config: PdmuxConfig | None = None,
                 sms: int | None = None, cc_major: int = MAJOR_FOR_UNKNOWN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`sms`: the device's SM count, for the config's levels when no log gives them."""
        self.follower, self.config, self.sms, self.cc_major, self.clock = follower, config, sms, cc_major, clock
        self.log = SglangLog()

    def poll(self) -> bool:
        """Read the log's new lines; True if the split changed."""
        if self.follower is None:
            return False
        now = self.clock()
        changed = False
        for line in self.follower.read_lines():
            changed |= self.log.feed(line, now)
        return changed

    def fill(self, read: Metrics) -> None:
        """Put the log's batch figures into `read` where the page lacks them; `read.log` names them."""
        self.poll()
        batch = self.log.totals()
        if batch is None:
            return
        taken = []
        for name, value in (("running", batch.running), ("waiting", batch.queued), ("kv_usage", batch.kv_usage),
                            ("prompt_tokens_per_s", batch.input_tokens_per_s),
                            ("generation_tokens_per_s", batch.gen_tokens_per_s)):
            if value is not None and name in read.absent:
                setattr(read, name, float(value))
                taken.append(name)
        queues = {"prefill_bootstrap_queue": batch.bootstrap, "prefill_inflight_queue": batch.inflight,
                  "decode_prealloc_queue": batch.prealloc, "decode_transfer_queue": batch.transfer,
                  "decode_host_receive_queue": batch.host_receive}
        disagg = read.disagg
        for name, value in queues.items():
            if value is None or (disagg is not None and name not in disagg.absent):
                continue
            if disagg is None:
                disagg = read.disagg = Disagg(absent=frozenset(f.name for f in dataclasses.fields(Disagg)) - {"absent"})
            setattr(disagg, name, float(value))
            disagg.absent = disagg.absent - {name}
            taken.append(name)
        if not taken:
            return
        read.absent = read.absent - set(taken)
        read.not_exposed = [f for f in read.not_exposed if f not in taken]
        read.log = LogFigures(taken, round(max(0.0, self.clock() - batch.read_at), 3), len(self.log.batches))

    def log_read(self, t: float) -> Metrics | None:
        """A `metrics` event at Unix time `t` from the log alone (there is no page); None before the log's
        first batch line."""
        if self.follower is not None:
            self.poll()
        if self.log.totals() is None:
            return None
        read = Metrics(t, 0.0, not_exposed=list(FIELDS), absent=frozenset((*FIELDS, "itl_read_p50_s")))
        self.fill(read)
        return read

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
