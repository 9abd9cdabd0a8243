"""`pdtop bench --url` against a hostile server (issue 38 item 9), each case a real `pdtop` process against a
real loopback server (`HostileServer`) sending up to 128 MB: the run ends in one line saying which bound the
server broke, and the process's peak memory stays within 32 MB of a run against a well-behaved server
(measured: within 1 MB of its 92 MB).

The bounds (bench/openai_request.py): a stream line is at most 256 KiB, a response at most 4 lines a token
plus 4096, a /v1/models answer 1 MiB, an error body 4 KiB read and 200 characters shown; compressed
answers are refused; once a token has come, a stream may be silent for --stall-timeout-sec."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
from hostile_server import HostileServer

LIMIT = 128 << 20  # what a hostile server sends at most: on main, about this much is held
SLACK_MB = 32  # the peak RSS a hostile server may add over a well-behaved one's (measured: under 1)


# `python -m pdtop ARGS` that writes its peak RSS (VmHWM, kB) to a file as it exits: the kernel's ru_maxrss of
# a child also counts the pytest process it was forked from.
PEAK = """import atexit, runpy, sys
def peak(path):
    with open('/proc/self/status') as f:
        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(path, 'w') as out:
        out.write(kb)
atexit.register(peak, sys.argv[1])
sys.argv = ['pdtop', *sys.argv[2:]]
runpy.run_module('pdtop', run_name='__main__', alter_sys=True)
"""


def bench(url: str, *args: str) -> tuple[int, str, str, float]:
    """rc, stdout, stderr and the peak RSS in MB of `pdtop bench --url URL` (two requests after the warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = os.path.join(tmp, "peak")
        out = subprocess.run([sys.executable, "-c", PEAK, peak, "bench", "--url", url, "--num-prompts", "2",
                              "--random-input-len", "8", "--random-output-len", "4", *args],
                             capture_output=True, text=True, timeout=120)
        with open(peak) as f:
            return out.returncode, out.stdout, out.stderr, int(f.read()) / 1024


@pytest.fixture(scope="module")
def baseline_mb() -> float:
    server = HostileServer("ok")
    try:
        rc, _, err, rss = bench(server.url)
    finally:
        server.close()
    assert rc == 0, err
    return rss


@pytest.fixture
def hostile():
    servers: list[HostileServer] = []

    def make(mode: str) -> HostileServer:
        servers.append(HostileServer(mode, LIMIT))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("mode,message", [
    ("endless", "the stream ran past 4112 lines for max_tokens 4"),  # 4 a token + 4096
    ("pings", "the stream ran past 4112 lines for max_tokens 4"),
    ("long_line", "the server sent a line over 262144 bytes"),
    ("gzip", "the server compressed its stream (gzip) though asked not to"),
    ("deep", "an event is nested deeper than the JSON parser goes"),
])
def test_a_hostile_stream_ends_the_run_in_one_line_within_the_memory_bound(mode, message, hostile, baseline_mb):
    server = hostile(mode)
    rc, out, err, rss = bench(server.url)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "the warm-up request" in err and message in err
    assert rss < baseline_mb + SLACK_MB, (rss, baseline_mb)
    assert server.sent < LIMIT // 2  # the client stopped reading


def test_a_huge_models_listing_is_refused_unread(hostile, baseline_mb):
    server = hostile("models")
    rc, out, err, rss = bench(server.url)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"GET {server.url}/v1/models: the answer is over 1048576 bytes" in err
    assert rss < baseline_mb + SLACK_MB and server.sent < LIMIT // 2


def test_a_stream_that_falls_silent_fails_after_the_stall_timeout(hostile):
    server = hostile("silent")  # one token, then nothing and no [DONE], the connection held open
    rc, out, err, _ = bench(server.url, "--stall-timeout-sec", "1")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "the warm-up request" in err and "the stream fell silent for 1 s" in err
    rc, out, err, _ = bench(server.url, "--stall-timeout-sec", "1", "--no-warmup", "--save-result",
                            "--result-filename", os.devnull)
    assert rc == 1 and "Failed requests:                         2" in out
    assert err == "pdtop bench: error: no request completed: the stream fell silent for 1 s\n"


def test_an_error_body_reaches_the_terminal_with_its_control_characters_visible(hostile):
    server = hostile("escape")  # HTTP 500: ESC[2J (clear the screen), OSC 0 (the window title), BEL
    rc, out, err, _ = bench(server.url)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "\x1b" not in err and "\x07" not in err
    assert "HTTP 500: \\x1b[2J\\x1b]0;pwned\\x07 the server says no\\n" in err
