"""`tune --launch`'s round reader on a real `pdtop serve` (sim:H100): the rounds it takes for a window are
those a second client of the same server receives, and their ITLs are the requests' own token gaps as the
server reports them; no hello on the port is one line, in the connect timeout."""
from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pdtop.analysis.metrics import percentile
from pdtop.engine.errors import EngineError
from pdtop.tune.http_workload import launch_scenario, run_http
from pdtop.tune.round_reader import RoundReader, SeenRound, round_itls
from pdtop.tune.server_process import free_port

SCENARIO = dataclasses.replace(launch_scenario("sim"), decode_bs=3, decode_prompt=64, long_tokens=1024, long_prompts=2,
                               decode_tokens=24)


@pytest.fixture(scope="module")
def serve():
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", "serve", "--device", "sim:H100", "--port", "0",
                             "--api-port", "0", "--workload", "none"], stdout=subprocess.PIPE, text=True)
    try:
        ws_url, api_url = proc.stdout.readline().split()[-1], proc.stdout.readline().split()[-1]
        yield int(ws_url.rsplit(":", 1)[1].strip("/")), api_url.removesuffix("/v1")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_window_is_the_rounds_another_client_sees_and_their_itls_the_requests_gaps(serve):
    port, api = serve
    events: list[dict] = []
    with connect(f"ws://127.0.0.1:{port}/", max_size=1 << 24) as ws:
        def read() -> None:
            try:
                for frame in ws:
                    events.append(json.loads(frame))
            except ConnectionClosed:
                pass

        reader_thread = threading.Thread(target=read, daemon=True)
        reader_thread.start()
        reader = RoundReader(port)
        try:
            reader.begin()
            prompts = ([f"decode prompt {i} " * 20 for i in range(12)], ["a long prompt " * 300] * 2)
            run = run_http(api, SCENARIO, float("inf"), prompts, timeout_s=120)
            taken = reader.rounds_in(run.start, run.start + run.window_s)
            itls = reader.window(run.start, run.start + run.window_s)
        finally:
            reader.close()
        time.sleep(0.3)
        ws.close()
        reader_thread.join(5)
    seen = {e["index"]: e for e in events if e["type"] == "round"}
    assert len(taken) > 10 and any(r.decode_bs for r in taken)
    # the same rounds as a client of its own receives: contiguous, each field as sent
    assert [r.index for r in taken] == list(range(taken[0].index, taken[-1].index + 1))
    assert all((seen[r.index]["time"], seen[r.index]["decode_bs"], seen[r.index]["running"])
               == (r.time, r.decode_bs, r.running) for r in taken)
    assert itls == round_itls(taken) and itls is not None and itls.rounds == sum(r.decode_bs > 0 for r in taken)
    # ITLs as pdtop's own tune counts them, from each request's token times (its finish event's time and
    # gaps, as the server reports them): the gaps that ended in the window's rounds
    t0, t1 = taken[0].time, taken[-1].time
    gaps = []
    for e in events:
        if e["type"] == "request" and e["kind"] == "finish":
            end = e["time"]
            for g in reversed(e["itls_s"]):
                if t0 < end <= t1 + 1e-9:
                    gaps.append(g)
                end -= g
    assert len(gaps) == itls.gaps
    assert (itls.itl_p50_s, itls.itl_p99_s) == pytest.approx((percentile(gaps, 50), percentile(gaps, 99)), abs=1e-6)


def test_no_pdtop_protocol_on_the_port_is_one_line_within_the_timeout():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        RoundReader(port, connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 5
    assert str(err.value).startswith(f"no pdtop protocol on control port {port} within 1 s: ")
    assert "\n" not in str(err.value)


def test_round_itls_counts_a_gap_per_request_and_breaks_at_a_missed_round():
    def r(index: int, t: float, bs: int, running: int | None = None) -> SeenRound:
        return SeenRound(0.0, index, t, bs, bs if running is None else running)

    # 2 decoding, a 10 ms round, a prefill round joining a third (no decode), 30 ms later all 3 decode
    got = round_itls([r(0, 0.0, 2), r(1, 0.010, 2), r(2, 0.020, 0, 3), r(3, 0.040, 3), r(5, 0.045, 3),
                      r(6, 0.050, 3)])
    # gaps: 10 ms x2, 30 ms x3 (since the decode batch last got tokens at 10 ms), round 5 follows a missed
    # round 4 (not counted), 5 ms x3
    assert got is not None and (got.rounds, got.gaps) == (5, 8)
    assert got.itl_p50_s == pytest.approx(percentile([0.010] * 2 + [0.030] * 3 + [0.005] * 3, 50))
    assert got.itl_p99_s == pytest.approx(percentile([0.010] * 2 + [0.030] * 3 + [0.005] * 3, 99))
    assert round_itls([r(0, 0.0, 2)]) is None  # one round: no gap
