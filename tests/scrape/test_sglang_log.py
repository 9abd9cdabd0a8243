"""An SGLang pdmux server's split from its log: SGLang's exact lines, the first rank only, noise, restarts,
and a followed file or pipe across partial lines, rotation and truncation."""
from __future__ import annotations

import os

from pdtop.telemetry.scrape.sglang_log import LogSplit, first_rank_message
from pdtop.telemetry.sources.log_follow import MAX_LINE, LogFollower

from .sglang_lines import H100_LEVELS, adjust, decode_batch, line, start_up


def test_the_start_up_line_sets_the_levels_and_each_adjust_line_the_level():
    split = LogSplit()
    assert split.feed(start_up(), 0.0)
    assert split.levels == H100_LEVELS and split.sms == 132 and split.level is None
    assert split.feed(adjust(4), 1.0)
    assert (split.level, split.prefill_sm, split.decode_sm) == (4, 88, 44)
    split.feed(adjust(7), 3.0)
    split.feed(adjust(4), 3.5)
    assert split.times(4.0) == [0, 0, 0, 0, 2.5, 0, 0, 0.5]
    assert split.changes == 3


def test_only_the_first_rank_counts_and_noise_changes_nothing():
    split = LogSplit()
    split.feed(start_up(), 0.0)
    split.feed(adjust(2), 0.0)
    for noise in (adjust(6, rank=" TP1"), adjust(6, rank=" DP1 TP0"), start_up([(10, 0), (0, 10)], rank=" TP3"),
                  decode_batch(), "Traceback (most recent call last):\n", "\x00\xff garbage\n",
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
    split = LogSplit()
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
