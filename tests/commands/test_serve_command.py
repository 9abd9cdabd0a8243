"""`pdtop serve` and `pdtop record` as subprocesses: the URL line, SIGKILL leaves a
replayable recording, Ctrl-C stops cleanly, bad arguments exit 2 with one line."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from telemetry.conftest import Pump

from pdtop.cli import main
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.recording.recorder import RecordingError
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.replay import ReplaySource

PDTOP = [sys.executable, "-m", "pdtop"]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*PDTOP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def url_of(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line.startswith("pdtop serve: listening on ws://127.0.0.1:"), line
    return line.split()[-1]


def wait_for_rounds(path, n: int, timeout: float = 20.0):
    """Poll the file being written until it holds `n` rounds (it is flushed twice a second)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rec = read_recording(path)
            if rec.types.count("round") >= n:
                return rec
        except RecordingError:
            pass  # not even the header yet
        assert time.monotonic() < deadline, f"{path} never held {n} rounds"
        time.sleep(0.1)


def check_replayable(path):
    rec = read_recording(path)
    assert rec.header["format"] == "pdtop-recording" and rec.hello["type"] == "hello"
    assert rec.skipped == 0
    rounds = [e["index"] for _, e in rec if e["type"] == "round"]
    assert rounds and rounds == list(range(rounds[0], rounds[0] + len(rounds)))
    return rec


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        for f in (p.stdout, p.stderr):
            f.close()


async def test_serve_record_survives_sigkill_and_replays(tmp_path, procs):
    path = tmp_path / "serve.ndjson.gz"
    serve = start("serve", "--device", "sim:H100", "--port", "0", "--rate", "20", "--record", str(path))
    procs.append(serve)
    url = url_of(serve)
    src = LiveSource(url)
    pump = Pump(src)
    hello = await pump.get()
    assert hello["engine"]["device"]["name"] == "sim:H100"
    await src.close()
    await asyncio.to_thread(wait_for_rounds, path, 20)
    serve.send_signal(signal.SIGKILL)
    serve.wait(10)
    rec = check_replayable(path)
    # the recording's hello is from when it started: the config and the request totals may have moved since
    assert rec.hello["engine"] == {**hello["engine"], "config": rec.hello["engine"]["config"],
                                   "totals": rec.hello["engine"]["totals"]}
    replay = ReplaySource(path, speed=16, hold_at_end=False)
    events = [e async for e in replay.events()]
    assert events[0] == rec.hello and len(events) == len(rec) + 1


async def test_record_command_survives_sigkill_and_serve_stops_on_ctrl_c(tmp_path, procs):
    serve = start("serve", "--device", "sim:H100", "--port", "0")
    procs.append(serve)
    url = url_of(serve)
    path = tmp_path / "client.ndjson.gz"
    record = start("record", url, "-o", str(path))
    procs.append(record)
    await asyncio.to_thread(wait_for_rounds, path, 20)
    record.send_signal(signal.SIGKILL)
    record.wait(10)
    rec = check_replayable(path)
    assert rec.hello["readonly"] is False and rec.hello["client_id"]
    serve.send_signal(signal.SIGINT)
    assert serve.wait(20) == 0
    assert "stopped" in serve.stderr.read()


def test_record_stops_after_duration_and_closes_the_file(tmp_path, procs):
    serve = start("serve", "--device", "sim:A100", "--port", "0", "--policy", "chunked")
    procs.append(serve)
    url = url_of(serve)
    path = tmp_path / "short.ndjson"
    done = subprocess.run([*PDTOP, "record", url, "-o", str(path), "--duration", "1"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    rec = check_replayable(path)
    assert not rec.truncated and rec.hello["engine"]["policy"] == "chunked"


@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_record_with_nothing_listening_says_nothing_was_recorded(scheme, tmp_path):
    """Issue 42 item 19: `record http://...` with nothing listening exited 0 after --duration and wrote nothing."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"{scheme}://127.0.0.1:{s.getsockname()[1]}"
    path = tmp_path / "never.ndjson"
    out = subprocess.run([*PDTOP, "record", url, "-o", str(path), "--duration", "1"],
                         capture_output=True, text=True, timeout=60)
    last = out.stderr.splitlines()[-1]
    assert out.returncode == 1 and not path.exists(), out.stderr
    assert last.startswith(f"pdtop record: error: nothing recorded: {url}") and "never answered: connection refused" \
        in last and last.endswith(f"; {path} was not written")



def test_record_of_a_fleet_that_never_answered_says_nothing_was_recorded(tmp_path):
    """The fleet form of the case above: a recording of only 'connecting' rows is not a recording."""
    import socket

    with socket.socket() as a, socket.socket() as b:  # two ports nothing listens on
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
    path = tmp_path / "never.ndjson"
    out = subprocess.run([*PDTOP, "record", "--prefill", urls[0], "8998", "--decode", urls[1], "-o", str(path),
                          "--interval", "0.2", "--duration", "1.5"], capture_output=True, text=True, timeout=60)
    last = out.stderr.splitlines()[-1]
    assert out.returncode == 1 and not path.exists() and "recording to" not in out.stdout, out.stderr
    assert last.startswith("pdtop record: error: nothing recorded: none of 2 servers ever answered (") \
        and "connection refused" in last and last.endswith(f"; {path} was not written")

@pytest.mark.parametrize("args, words", [
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--host", "0.0.0.0"], "needs --token"),
    (["serve", "--device", "tpu"], "unknown device"),
    (["serve", "--device", "sim:H100", "--config", "/nonexistent.yaml"], "cannot read"),
    (["serve", "--device", "sim:H100", "--rate", "-3"], "--rate"),
    (["serve", "--device", "sim:H100", "--record", "/nonexistent-dir/r.ndjson", "--port", "0"], "cannot write"),
    (["serve", "--policy", "fastest"], "invalid choice"),
    (["record", "ftp://x", "-o", "f"], "not a ws:// or http:// URL"),
    (["record", "http://x", "-o", "f", "--interval", "0"], "--interval"),
    (["record", "ws://127.0.0.1:1", "-o", "f", "--model-name", "m"], "--model-name is for http://"),
    (["record", "ws://127.0.0.1:1", "-o", "f", "--interval", "2"], "--interval is for http://"),
    (["record", "ws://127.0.0.1:1"], "-o"),
])
def test_bad_arguments_exit_2_with_one_line(args, words, capsys):
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and words in lines[0], err


@pytest.mark.parametrize("command, args, words", [
    # issue 42 item 19: each started and served, every workload request rejected or the dtype ignored
    (["serve"], ["--kv-tokens", "100"], "the KV cache (96 tokens) cannot hold the workload's largest request "
                                        "(8192-token prompt + 1024 output tokens): each would be rejected; "
                                        "give --kv-tokens 9216 or more, or --workload none"),
    (["serve"], ["--dtype", "gguf"], "dtype gguf (compute on the file's quantized blocks) runs on the CPU, "
                                     "not a sim: device"),
    (["serve"], ["--dtype", "float32"], "dtype float32 runs on cpu or cuda; a sim: device models bfloat16"),
    ([], ["--dtype", "gguf"], "runs on the CPU, not a sim: device"),  # the dashboard, before its engine starts
])
def test_an_engine_that_could_not_do_what_is_asked_does_not_start(command, args, words):
    port = ["--port", "0"] if command else []
    out = subprocess.run([*PDTOP, *command, "--device", "sim:H100", *port, *args],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"pdtop {command[0] if command else 'dashboard'}: error: ") and words in lines[0]


def test_serve_with_a_small_cache_and_no_workload_starts(procs):
    """`--workload none` sends nothing the cache must hold: API requests are checked one by one."""
    serve = start("serve", "--device", "sim:H100", "--port", "0", "--kv-tokens", "100", "--workload", "none")
    procs.append(serve)
    url_of(serve)


@pytest.mark.parametrize("flag", ["--port", "--api-port"])
def test_a_port_in_use_is_reported_before_the_model_loads(flag):
    """Issue 25 item 20: on cpu it was reported only after the model loaded (seconds)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--port", str(port)] if flag == "--port" else ["--port", "0", "--api-port", str(port)]
        out = subprocess.run([*PDTOP, "serve", "--device", "cpu", "--progress", *args],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr == f"pdtop serve: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_serve_says_which_weights_path_runs_before_the_kv_line(model_fp32):
    from pdtop.commands.serve import runtime_lines
    from pdtop.engine.build import build_engine

    engine = build_engine("cpu", loaded_model=model_fp32, kv_capacity_tokens=2048)
    try:
        lines = runtime_lines(engine.describe().runtime or {})
    finally:
        engine.close()
    assert lines[0] == f"weights {model_fp32.weights}" and model_fp32.weights, lines
    assert lines[1].startswith("KV cache: 2,048 tokens"), lines
    assert runtime_lines({}) == []  # sim: devices describe no weights


def test_clients_that_leave_during_prefill_never_stop_serve_on_the_cpu(procs):
    """Issue 38 item 1: a long prompt POSTed to the API and its socket closed while it prefilled, twice,
    made `pdtop serve --device cpu` exit 1 ("its prefill is in flight; finish it before freeing")."""
    import json
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        api_port = s.getsockname()[1]
    proc = start("serve", "--device", "cpu", "--workload", "none", "--port", "0", "--api-port", str(api_port))
    procs.append(proc)
    url_of(proc)
    base = f"http://127.0.0.1:{api_port}"
    model = httpx.get(f"{base}/v1/models", timeout=60).json()["data"][0]["id"]
    for delay in (0.1, 0.3, 0.6, 1.0):
        body = json.dumps({"model": model, "prompt": [(11 * i) % 40000 + 20 for i in range(1500)], "max_tokens": 8,
                           "stream": delay > 0.5}).encode()
        with socket.create_connection(("127.0.0.1", api_port)) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(delay)  # closed while its prompt prefills
    answer = httpx.post(f"{base}/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 2},
                        timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
    assert proc.poll() is None
