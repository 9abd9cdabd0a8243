"""An SGLang server's log: its pdmux split and its batch figures from SGLang's exact lines (0.5.23's and older
releases' forms, hybrid models, PD servers), the rank tags in any combination, custom logging formats,
noise, restarts, hostile lines in linear time, and a followed file or pipe across partial lines, rotation
and truncation."""
from __future__ import annotations

import os
import time

from pdtop.telemetry.scrape.sglang_log import MAX_LINE as MAX_PARSED
from pdtop.telemetry.scrape.sglang_log import SglangLog, first_rank_message
from pdtop.telemetry.sources.log_follow import MAX_LINE, LogFollower

from ..sglang_lines import (
    H100_LEVELS,
    HYBRID_SSM,
    HYBRID_SWA,
    adjust,
    decode_batch,
    decode_message,
    decode_pd,
    line,
    old_decode_batch,
    old_prefill_pd,
    prefill_batch,
    start_up,
)


def test_the_start_up_line_sets_the_levels_and_each_adjust_line_the_level():
    split = SglangLog()
    assert split.feed(start_up(), 0.0)
    assert split.levels == H100_LEVELS and split.sms == 132 and split.level is None
    assert split.feed(adjust(4), 1.0)
    assert (split.level, split.prefill_sm, split.decode_sm) == (4, 88, 44)
    split.feed(adjust(7), 3.0)
    split.feed(adjust(4), 3.5)
    assert split.times(4.0) == [0, 0, 0, 0, 2.5, 0, 0, 0.5]
    assert split.changes == 3


def test_only_the_first_rank_counts_and_noise_changes_nothing():
    split = SglangLog()
    split.feed(start_up(), 0.0)
    split.feed(adjust(2), 0.0)
    for noise in (adjust(6, rank=" TP1"), adjust(6, rank=" DP1 TP0"), start_up([(10, 0), (0, 10)], rank=" TP3"),
                  "Traceback (most recent call last):\n", "\x00\xff garbage\n",
                  line("Adjusting stream groups: x, prefill sm: ?, decode sm: ?"),
                  line("PD-Multiplexing enabled with 2 stream groups, sm_counts (prefill_sm, decode_sm): [ nonsense"),
                  line(f"Adjusting stream groups: 999999, prefill sm: {1 << 20}, decode sm: 0"), "\n"):
        assert not split.feed(noise, 1.0)
    assert split.levels == H100_LEVELS and split.level == 2
    assert first_rank_message(adjust(1, rank=" DP0 TP0")) is not None
    assert first_rank_message("\x1b[32m" + adjust(1, rank=" TP0", ).rstrip() + "\x1b[0m") is not None
    newer = "[12-01 10:00:01 TP0] Adjusting stream groups: 3, prefill sm: 96, decode sm: 36"  # newer datefmt
    assert split.feed(newer, 2.0) and split.level == 3


def test_a_new_start_up_line_is_a_restarted_server():
    split = SglangLog()
    split.feed(start_up(), 0.0)
    split.feed(adjust(5), 0.0)
    other = [(132, 0), (66, 66), (0, 132)]
    split.feed(start_up(other), 5.0)
    assert split.levels == other and split.level is None and split.starts == 2 and split.times(6.0) == [0, 0, 0]


def _write(path, text: str, mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)


def test_a_followed_file_across_partial_lines_rotation_and_truncation(tmp_path):
    path = tmp_path / "sglang.log"
    follower = LogFollower(path=str(path))
    assert follower.read_lines() == [] and "waiting for it" in follower.problem
    _write(path, start_up() + adjust(3)[:20])
    got = follower.read_lines()
    assert got == [start_up().rstrip("\n")] and follower.problem is None
    _write(path, adjust(3)[20:])
    assert follower.read_lines() == [adjust(3).rstrip("\n")]
    _write(path, "x" * (MAX_LINE + 10) + "\n" + adjust(4))  # an overlong line is dropped, the next kept
    assert follower.read_lines() == [adjust(4).rstrip("\n")]
    _write(path, adjust(5)[:-1])  # rotated away with its last line unfinished, then a new file
    os.rename(path, tmp_path / "sglang.log.1")
    _write(path, adjust(6))
    assert follower.read_lines() == [adjust(5).rstrip("\n"), adjust(6).rstrip("\n")]
    assert follower.rotations == 1
    _write(path, "", mode="w")  # copytruncate: emptied in place, then written on
    assert follower.read_lines() == []
    _write(path, adjust(1))
    assert follower.read_lines() == [adjust(1).rstrip("\n")] and follower.rotations == 2
    follower.close()


def test_a_followed_pipe_until_it_closes():
    read_end, write_end = os.pipe()
    follower = LogFollower(fd=read_end)
    assert follower.read_lines() == []  # nothing written yet: no waiting
    os.write(write_end, (start_up() + adjust(2)[:10]).encode())
    assert follower.read_lines() == [start_up().rstrip("\n")]
    os.write(write_end, adjust(2)[10:].encode())
    os.close(write_end)
    assert follower.read_lines() == [adjust(2).rstrip("\n")]
    assert follower.read_lines() == [] and follower.ended
    os.close(read_end)


def totals(*lines: str):
    log = SglangLog()
    for text in lines:
        log.feed(text, 1.0)
    return log.totals()


def test_batch_lines_as_each_release_writes_them():
    t = totals(decode_batch(12, 3))
    assert (t.running, t.queued, t.kv_usage, t.gen_tokens_per_s, t.graph) == (12, 3, 0.03, 812.45, True)
    t = totals(decode_batch(12, 3), prefill_batch(running=13, queued=1))  # the latest line's gauges
    assert (t.running, t.queued, t.gen_tokens_per_s, t.input_tokens_per_s, t.graph) == (13, 1, 812.45, 1204.51, False)
    assert totals(decode_batch(usage=HYBRID_SWA)).kv_usage == 0.52  # SGLang's token usage: the fuller pool
    assert totals(decode_batch(usage=HYBRID_SSM)).kv_usage == 0.41  # mamba is not in it
    assert totals(decode_batch(graph="npu graph")).graph is True
    t = totals(old_decode_batch(233, 317, 0.82, 4594.01))  # 0.3-0.4: "Decode batch." and no graph field
    assert (t.running, t.queued, t.kv_usage, t.gen_tokens_per_s, t.graph) == (233, 317, 0.82, 4594.01, None)
    t = totals(line("Decode batch. #running-req: 1, #token: 501, token usage: 0.02, cuda graph: True, "
                    "gen throughput (token/s): 65.75, #queue-req: 0,", ""))  # 2025's trailing comma
    assert (t.running, t.queued, t.gen_tokens_per_s) == (1, 0, 65.75)
    t = totals(old_prefill_pd(bootstrap=4, queued=2, transferring=5))
    assert (t.bootstrap, t.inflight, t.queued, t.running) == (4, 5, 2, 0)
    t = totals(prefill_batch(bootstrap=3, inflight=1))
    assert (t.bootstrap, t.inflight) == (3, 1)
    t = totals(decode_batch(pd=decode_pd(5, 3, host_receive=2)))
    assert (t.prealloc, t.transfer, t.host_receive) == (5, 3, 2)
    t = totals(line(decode_message(7, 0).replace("Decode batch,", "Decode batch [4096],")))  # LOG_FORWARD_ITERS
    assert t.running == 7
    assert totals(line("Decode batch, nothing here")) is None and totals(line("Decode batch, #running-req: x")) is None


def test_rank_tags_in_any_combination():
    full = " DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0"
    log = SglangLog()
    assert log.feed(start_up(rank=full), 0.0) and log.feed(adjust(3, rank=full), 1.0)
    for other in (" DP0 PP0 ATTN_CP1 MOE_DP0 TP0 EP0", " MOE_DP1", " EP2", " DP0 PP1", " ATTN_CP1 TP0"):
        assert first_rank_message(adjust(5, rank=other)) is None
        assert not log.feed(adjust(5, rank=other), 2.0)
    assert log.level == 3
    # each DP rank's attention-TP rank 0 logs its batch: summed, KV averaged; a PP or ATTN_CP copy is not
    log.feed(decode_batch(5, 1, rank=" DP0 TP0", throughput=100.0), 3.0)
    log.feed(decode_batch(7, 2, rank=" DP1 ATTN_CP0 MOE_DP1 TP4 EP4", throughput=200.0,
                          usage="#token: 9, token usage: 0.07"), 3.0)
    assert not log.feed(decode_batch(99, 99, rank=" DP0 PP1 TP0"), 3.0)
    assert not log.feed(decode_batch(99, 99, rank=" DP1 ATTN_CP1 TP5"), 3.0)
    t = log.totals()
    assert (t.running, t.queued, t.gen_tokens_per_s, round(t.kv_usage, 3)) == (12, 3, 300.0, 0.05)
    assert first_rank_message(line("Adjusting stream groups: 1, prefill sm: 112, decode sm: 20", "")) is not None
    with_ms = "[2026-12-01 10:00:01.123 DP0 TP0] "  # SGLANG_LOG_MS
    assert log.feed(with_ms + "Adjusting stream groups: 4, prefill sm: 88, decode sm: 44", 4.0) and log.level == 4


CUSTOM = ("2026-12-01 10:00:01,123 INFO sglang.srt.managers.scheduler: ",  # logging's default datefmt, no brackets
          "2026-12-01T10:00:01.123+00:00 | scheduler | INFO | ",  # ISO time, a pipe layout
          "")  # the bare message


def test_custom_formats_without_rank_tags_and_each_tp_ranks_start_up_line():
    for prefix in CUSTOM:
        log = SglangLog()
        startup = start_up(rank="").split("] ", 1)[1]
        for _rank in range(4):  # SGLANG_LOGGING_CONFIG_PATH drops the tags: every TP rank's line is the same
            log.feed(prefix + startup, 0.0)
        assert log.starts == 1 and log.levels == H100_LEVELS, prefix
        for _rank in range(4):
            log.feed(prefix + adjust(2).split("] ", 1)[1], 1.0)
        assert (log.level, log.changes) == (2, 1)
        assert log.feed(prefix + decode_message(6, 1), 2.0) and log.totals().running == 6
        log.feed(prefix + startup, 9.0)  # after it ran: a restart
        assert log.starts == 2 and log.level is None and log.totals() is None


STARTS = "PD-Multiplexing enabled with 8 stream groups, sm_counts (prefill_sm, decode_sm): ["
# Hostile lines of 64 KiB (the follower's bound), each aimed at one step of the parse: main's prefix
# regular expression took 15.1 s (12.8 s of CPU here) on the first alone.
HOSTILE = ("[" + " AB1" * (MAX_PARSED // 4),
           "[" + " TP1" * (MAX_PARSED // 4 - 1) + "] Decode batch, #running-req: 1",
           "Decode batch, " + "#running-req: 1, " * (MAX_PARSED // 17),
           "Decode batch," + ":" * MAX_PARSED,
           "Decode batch, #running-req: " + "9" * MAX_PARSED,
           STARTS + "(1, " * (MAX_PARSED // 4),
           STARTS + "(1, 2), " * 8000 + "]",
           "\x1b[" * (MAX_PARSED // 2),
           "\x1b[" + "1;" * (MAX_PARSED // 2),
           "Adjusting stream groups: " + "1" * MAX_PARSED,
           "x" * (MAX_PARSED * 4) + "Decode batch, #running-req: 1")  # past the bound: not read


def test_hostile_lines_parse_in_linear_time():
    """The bound: all eleven lines in under 1 s of this process's CPU (`process_time`, not the wall clock:
    other work on the machine does not count). The parse is linear (sglang_log's docstring: `find`,
    bounded `split`s, `partition`, `translate` and one-pass scans, each character looked at a bounded
    number of times), about 20 ms of CPU for all of them here; main's regular expression needed 12.8 s
    for the first, so the bound is 50 times what the parse needs and a twelfth of what main took."""
    log = SglangLog()
    log.feed(start_up(), 0.0)
    started = time.process_time()
    for text in HOSTILE:
        log.feed(text, 1.0)
        log.feed(text + "\n", 1.0)
    spent = time.process_time() - started
    assert spent < 1.0, f"{spent:.2f} s of CPU for {len(HOSTILE) * 2} hostile lines"
    assert log.levels == H100_LEVELS and log.starts == 1  # none of them was taken for SGLang's
    assert log.totals() is None or log.totals().running in (None, 1)
