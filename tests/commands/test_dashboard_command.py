"""`pdtop dashboard` runs `pdtop serve` as a child: found by its first line, stopped on quit, never orphaned."""
from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pdtop.commands._startup import device_choice
from pdtop.commands.dashboard import Progress, serve_command, start_server, stop_server
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp

ARGS = argparse.Namespace(device="sim:H100", model=None, config=None, policy=None, rate=4.0, record=None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_serve_command_line():
    cmd = serve_command(ARGS)
    assert cmd[:4] == [sys.executable, "-m", "pdtop", "serve"]
    assert cmd[cmd.index("--port") + 1] == "0" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert "--token" not in cmd  # it goes in the environment, out of `ps`
    assert "--progress" in cmd  # its start-up lines, shown while the dashboard waits
    assert cmd[cmd.index("--device") + 1] == "sim:H100"
    assert "--model" not in cmd  # defaults are the server's


async def test_dashboard_attaches_to_its_child_and_stops_it(tmp_path, until):
    log = open(tmp_path / "serve.log", "w")
    said = io.StringIO()
    child, url = start_server(ARGS, "secret", log, Progress(said))
    assert said.getvalue().splitlines() == [  # the child's start-up, as it came
        "  using sim:H100 (a simulated H100), 132 SMs",
        "  synthetic model qwen3-8b (no weights to load)",
        f"  ready in {said.getvalue().split('ready in ')[1].split(' s:')[0]} s: model synthetic:qwen3-8b on sim:H100",
    ]
    try:
        assert url.startswith("ws://127.0.0.1:")
        app = PdtopApp(LiveSource(url, token="secret"))
        async with app.run_test(size=(130, 40)) as pilot:
            await until(pilot, lambda: app.connection == "live" and app.state.rounds_seen > 2, "rounds from the child")
            assert not app.readonly and app.state.info.device == "sim:H100"
    finally:
        stop_server(child)
        log.close()
    assert child.returncode is not None and not _alive(child.pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_does_not_outlive_a_killed_dashboard(tmp_path):
    script = textwrap.dedent(f"""
        import argparse, sys, time
        from pdtop.commands.dashboard import start_server
        args = argparse.Namespace(device="sim:H100", model=None, config=None, policy=None, rate=1.0, record=None)
        child, url = start_server(args, "t", open({str(tmp_path / 'log')!r}, "w"))
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
        parent.send_signal(signal.SIGKILL)  # a crash: no clean-up code runs
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the serve child outlived its dashboard"
    finally:
        parent.kill()


def test_the_device_choice_is_explained():
    import torch

    said = device_choice("auto")
    if torch.cuda.is_available():
        assert said.startswith("CUDA device found: using cuda:0")
    else:
        assert said.startswith("no CUDA device (") and ": using cpu, " in said and said.endswith(("core", "cores"))
    assert device_choice("sim:H100") == "using sim:H100 (a simulated H100), 132 SMs"


def test_the_api_the_header_shows_takes_the_token_in_pdtop_token(tmp_path):
    """Issue 42 item 2: `pdtop dashboard` showed `api :PORT` while every call got 401 (its token was random and
    shown nowhere). With $PDTOP_TOKEN set, that is the token: the API answers it."""
    import httpx

    env = {**os.environ, "PDTOP_TOKEN": "mine-1234", "TEXTUAL_DRIVER": "textual.drivers.headless_driver:HeadlessDriver"}
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", "--device", "sim:H100"], env=env, cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        log = first.split("(log: ", 1)[1].rstrip().rstrip(")")
        deadline, api = time.monotonic() + 60, None
        while api is None and time.monotonic() < deadline and proc.poll() is None:
            said = [line for line in open(log).read().splitlines() if line.startswith("pdtop serve: api on ")]
            api = said[0].rsplit(" ", 1)[1] if said else None
            time.sleep(0.2)
        assert api is not None, "the child's API address"
        assert httpx.get(f"{api}/models", headers={"Authorization": "Bearer mine-1234"}).status_code == 200
        assert httpx.get(f"{api}/models", headers={"Authorization": "Bearer other"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
