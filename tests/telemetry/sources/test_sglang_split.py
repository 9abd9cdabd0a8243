"""`attach http://... --sglang-log / --pdmux-config`: an SGLang server's split on screen from its log (in the
embedded engine's words), inferred from its YAML (said so), recorded and replayed, and bad options refused."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from pdtop.commands import attach
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Metrics
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.sources.log_follow import LogFollower
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.telemetry.sources.sglang_split import SglangSplit
from pdtop.ui.app import PdtopApp

from ..conftest import shown
from ..conftest import until_shown as until
from ..sglang_lines import adjust, decode_batch, start_up

MANUAL_YAML = "sm_group_num: 5\nmanual_divisions: [[100, 32, 1], [66, 66, 8], [32, 100, 32]]\n"


def attach_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    return parser.parse_args(list(argv))


def level_of(app: PdtopApp) -> int | None:
    m = app.state.scrape.latest if app.state.scrape is not None else None
    return m.split.level if m is not None and m.split is not None else None


async def test_the_log_gives_the_split_in_the_engines_words_at_both_sizes(sglang, tmp_path):
    log = tmp_path / "sglang.log"
    sglang.itl.observe(0.009)
    for size in ((160, 48), (80, 24)):
        log.write_text(decode_batch() + start_up() + adjust(4) + adjust(6, rank=" TP1"))
        source = PrometheusSource(sglang.server.url, interval=0.1, window_s=600.0,
                                  split=SglangSplit(LogFollower(path=str(log))))
        app = PdtopApp(source, interval_s=0.05)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda app=app: level_of(app) == 4, "level 4 from the log")
            panel = shown(app, "SplitPanel")
            assert "level 4/7  88/44 SMs  log" in panel
            assert app.query_one("SplitPanel").border_title == "SMs split"
            if size == (160, 48):
                assert "prefill 88 SMs" in panel and "decode 44 SMs" in panel and "from SGLang's log" in panel
                assert "▶  4" in panel and "88/44" in panel
            with log.open("a") as f:  # the level changes, then the server restarts with other levels
                f.write(adjust(7))
            await until(pilot, lambda app=app: level_of(app) == 7, "level 7")
            assert "level 7/7  0/132 SMs" in shown(app, "SplitPanel")
            timeline = shown(app, "TimelinePanel")  # the level band, a column per read, as for rounds
            assert "split" in timeline and timeline.splitlines()[1].rstrip().endswith("7")
            assert "4" in timeline.splitlines()[1]
            with log.open("a") as f:
                f.write(start_up([(132, 0), (66, 66), (0, 132)]) + adjust(1, [(132, 0), (66, 66), (0, 132)]))
            await until(pilot, lambda app=app: level_of(app) == 1 and app.state.scrape.latest.split.starts == 2,
                        "a restart")
            assert "level 1/2  66/66 SMs" in shown(app, "SplitPanel")
            if size == (160, 48):
                assert "restarted 1×" in shown(app, "SplitPanel")
        await source.close()


async def test_the_config_gives_the_levels_and_an_inferred_level(sglang, tmp_path):
    config = tmp_path / "pdmux.yaml"
    config.write_text(MANUAL_YAML)
    sglang.running.set(12)  # 12 decoding >= the threshold 8 of division 2, with 3 waiting for a prefill
    sglang.queue.set(3)
    source = attach.make_source(attach_args(sglang.server.url, "--pdmux-config", str(config), "--gpu", "H100"))
    source.interval = 0.1
    app = PdtopApp(source, interval_s=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: level_of(app) == 2, "the inferred level")
        panel = shown(app, "SplitPanel")
        assert "level 2/4  66/66 SMs  inferred" in panel and "inferred: SGLang's rule for 12 running, 3 waiting" \
            in panel
        assert app.state.scrape.latest.split.inferred
        sglang.queue.set(0)  # nothing to prefill: all to decode, as SGLang does
        await until(pilot, lambda: level_of(app) == 4, "decode only")
        sglang.running.set(0)
        await until(pilot, lambda: level_of(app) == 0, "idle")
    await source.close()


def test_record_keeps_the_log_split_and_replay_shows_it(sglang, tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(start_up() + adjust(3))
    path = tmp_path / "sglang.ndjson"
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", sglang.server.url, "-o", str(path), "--interval",
                           "0.1", "--duration", "1.2", "--sglang-log", str(log)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    reads = [decode_event(e) for _, e in read_recording(path) if e["type"] == "metrics"]
    assert reads and all(isinstance(m, Metrics) and m.split.level == 3 and m.split.prefill_units == 96 for m in reads)

    async def replayed() -> str:
        app = PdtopApp(ReplaySource(path, speed=8.0), interval_s=0.05)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: level_of(app) == 3, "the replayed split")
            return shown(app, "SplitPanel")

    import asyncio
    assert "level 3/7  96/36 SMs  log" in asyncio.run(replayed())


def test_bad_split_options_are_one_line_and_exit_2(tmp_path):
    config = tmp_path / "pdmux.yaml"
    config.write_text(MANUAL_YAML)
    bad = tmp_path / "bad.yaml"
    bad.write_text("sm_group_num: 3\nmanual_divisions: [[200, 32, 1]]\n")
    for argv, said in ((["http://127.0.0.1:9", "--sglang-log", str(tmp_path / "none.log")], "No such file"),
                       (["http://127.0.0.1:9", "--sglang-log", str(tmp_path)], "a directory, not a log file"),
                       (["http://127.0.0.1:9", "--pdmux-config", str(config)], "needs --gpu NAME"),
                       (["http://127.0.0.1:9", "--pdmux-config", str(bad), "--gpu", "H100"], "the device has 132"),
                       (["http://127.0.0.1:9", "--gpu", "H100"], "--gpu is for --pdmux-config"),
                       (["ws://127.0.0.1:9", "--sglang-log", "x.log"], "--sglang-log is for http:// URLs")):
        with pytest.raises(ValueError) as refused:
            attach.make_source(attach_args(*argv))
        assert said in str(refused.value) and "\n" not in str(refused.value)
    # the command: one line, exit 2 (a session of its own: no terminal to open as /dev/tty)
    for argv, said in ((["--sglang-log", str(tmp_path / "none.log")], "No such file"),
                       (["--sglang-log", "-"], "the dashboard needs a terminal for its keys")):
        done = subprocess.run([sys.executable, "-m", "pdtop", "attach", "http://127.0.0.1:9", *argv],
                              capture_output=True, text=True, timeout=60, input="", start_new_session=True)
        assert done.returncode == 2 and said in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    primary, secondary = os.openpty()  # standard input a terminal: there is no log to read from it
    try:
        done = subprocess.run([sys.executable, "-m", "pdtop", "attach", "http://127.0.0.1:9", "--sglang-log", "-"],
                              capture_output=True, text=True, timeout=60, stdin=secondary, start_new_session=True)
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == 2 and "pipe the server's output in" in done.stderr
