"""Start the embedded engine and watch it in the dashboard (what `pdtop` alone does).

The engine runs as a `pdtop serve` child process on a free loopback port with a control token
($PDTOP_TOKEN if set, else a random one); the dashboard attaches to it and quitting (q) stops it.
The child also serves the OpenAI-compatible API on a free port (the header shows it, `api :PORT`),
which takes the same token: the help (?) shows the address and the curl line. The child is
tied to this process: it also stops if the dashboard crashes or is killed (Linux).
Its log goes to a temporary file, named when something goes wrong.

Default device: CUDA if available, else this machine's CPU cores, with SmolLM2-135M.
A simulated GPU (`--device sim:H100`) runs a synthetic 8B model on a virtual clock
(--speed 0.1 slows it down to watch a prefill advance layer by layer).
The default workload, per device (--rate adds Poisson arrivals):
{scenarios}

Examples:
  pdtop
  pdtop --device sim:H100 --rate 12
  pdtop dashboard --device cpu --policy chunked --theme pdtop-light
  pdtop dashboard --config pdmux.yaml --slo-ms 30
"""
from __future__ import annotations

import argparse
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from pdtop.commands._startup import READY
from pdtop.commands.common import DEVICE_HELP, INPUT_ERRORS, add_level_rule_arguments, add_runtime_arguments, fail
from pdtop.commands.serve import RATE_HELP, SCENARIOS_HELP, SPEED_HELP, check_inputs
from pdtop.engine.scheduling.policies import DEFAULT_POLICY, POLICIES
from pdtop.ui.cli_args import add_ui_arguments

__doc__ = __doc__.replace("{scenarios}", SCENARIOS_HELP)
SERVE_PREFIX = "pdtop serve: "
URL_PREFIX = SERVE_PREFIX + "listening on "
SERVE_ERROR = SERVE_PREFIX + "error: "  # how the child reports bad input (`fail`), before it exits 2
START_TIMEOUT_S = 300.0  # loading a real model on a slow CPU can take a while


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--device", metavar="DEV", help=DEVICE_HELP)
    parser.add_argument("--model", metavar="PATH|synthetic:NAME",
                        help="a GGUF file or synthetic:NAME (default SmolLM2-135M)")
    parser.add_argument("--config", metavar="FILE", help="SGLang-compatible pdmux YAML")
    parser.add_argument("--policy", choices=POLICIES, help=f"scheduling policy (default {DEFAULT_POLICY})")
    parser.add_argument("--rate", type=float, metavar="REQ_PER_S", help=RATE_HELP)
    parser.add_argument("--speed", type=float, metavar="X", help=SPEED_HELP)
    parser.add_argument("--record", metavar="FILE", help="record every event to FILE from the start")
    add_runtime_arguments(parser)
    add_level_rule_arguments(parser)
    add_ui_arguments(parser)


def serve_command(args: argparse.Namespace) -> list[str]:
    """The child's command line: `pdtop serve` on a free loopback port, with the HTTP API on another
    (its token comes in the environment)."""
    cmd = [sys.executable, "-m", "pdtop", "serve", "--host", "127.0.0.1", "--port", "0", "--api-port", "0",
           "--progress"]
    for flag in ("device", "model", "config", "policy", "rate", "speed", "record", "dtype", "kv_tokens",
                 "gpu_memory_fraction", "link", "level_rule", "slo_itl_ms"):
        value = getattr(args, flag, None)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if getattr(args, "cuda_graph", True) is False:
        cmd.append("--no-cuda-graph")
    return cmd


def _tie_to_parent(parent: int) -> None:
    """In the child, before exec: get SIGTERM when the dashboard process dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the dashboard's own clean-up is all there is
    if os.getppid() != parent:  # the parent died before the tie was made
        os._exit(1)


class Progress:
    """The start-up lines on stderr: each `pdtop serve:` line the child prints, and on a terminal a
    ticking `starting the engine… 3 s` under them until the dashboard takes the screen."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream, self.started = stream or sys.stderr, time.monotonic()  # stderr as it is now, not at import
        self.ticking = self.stream.isatty()
        self._ticker_shown = False

    def line(self, text: str) -> None:
        self._clear()
        print(f"  {text}", file=self.stream, flush=True)

    def tick(self) -> None:
        if self.ticking:
            self.stream.write(f"\r  starting the engine… {time.monotonic() - self.started:.0f} s\x1b[K")
            self.stream.flush()
            self._ticker_shown = True

    def _clear(self) -> None:
        if self._ticker_shown:
            self.stream.write("\r\x1b[K")
            self._ticker_shown = False

    def done(self) -> None:
        self._clear()
        self.stream.flush()


def start_server(args: argparse.Namespace, token: str, log: IO[str],
                 progress: Progress | None = None) -> tuple[subprocess.Popen, str]:
    """Start `pdtop serve` and return it with the URL from its first stdout line; RuntimeError if it fails.
    Its start-up lines (stderr, `pdtop serve: ...`) go to `progress` as they come, and everything to `log`."""
    parent = os.getpid()
    child = subprocess.Popen(
        serve_command(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PDTOP_TOKEN": token},  # not on the command line, where `ps` shows it
        start_new_session=True,  # terminal signals go to the dashboard, which stops the child itself
        preexec_fn=lambda: _tie_to_parent(parent),
    )
    assert child.stdout is not None and child.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    notes: queue.Queue[str] = queue.Queue()
    started, writing = threading.Event(), threading.Lock()

    def pump(stream: IO[str], out: queue.Queue[str]) -> None:  # keep reading: a full pipe blocks the child
        for line in stream:
            with writing:  # two pumps, one log
                log.write(line)
                log.flush()
            if not started.is_set():
                out.put(line)
        out.put("")

    for stream, out, name in ((child.stdout, lines, "stdout"), (child.stderr, notes, "stderr")):
        threading.Thread(target=pump, args=(stream, out), name=f"pdtop-serve-{name}", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S

    def show_notes(until_ready: bool = False) -> None:
        """Pass the child's start-up lines on; `until_ready`: wait (a moment) for its last one, which it
        wrote to stderr just before its URL went to stdout."""
        while True:
            try:
                note = notes.get(timeout=1.0) if until_ready else notes.get_nowait()
            except queue.Empty:
                return
            if note.startswith(SERVE_PREFIX) and not note.startswith(SERVE_ERROR) and progress is not None:
                # (an error line is not echoed: the dashboard reports it once, as its own)
                progress.line(note[len(SERVE_PREFIX):].rstrip())
            if not note or note.startswith(SERVE_PREFIX + READY):
                return

    try:
        while True:
            show_notes()
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if progress is not None:
                    progress.tick()
                if child.poll() is not None or time.monotonic() > deadline:
                    stop_server(child)
                    reason = "the engine did not start" if child.returncode else "the engine timed out starting"
                    raise RuntimeError(reason) from None
                continue
            if line.startswith(URL_PREFIX):
                show_notes(until_ready=True)
                return child, line[len(URL_PREFIX):].strip()
            if line == "":
                child.wait(timeout=10)
                raise RuntimeError(f"the engine exited (code {child.returncode}) before listening")
    finally:
        started.set()
        if progress is not None:
            progress.done()


def stop_server(child: subprocess.Popen, timeout: float = 10.0) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def run(args: argparse.Namespace) -> int:
    from pdtop.ui.launch import check_ui_options

    problem = check_ui_options(args)
    if problem:
        return fail("dashboard", problem)
    try:  # a bad device (or a missing GPU), model or config fails here in one line, not in the engine's log
        check_inputs(args)
    except INPUT_ERRORS as exc:
        return fail("dashboard", exc)
    token = os.environ.get("PDTOP_TOKEN") or secrets.token_urlsafe(24)  # yours, to call the API with
    log_file = tempfile.NamedTemporaryFile("w", prefix="pdtop-serve-", suffix=".log", delete=False)
    log_path = Path(log_file.name)
    print(f"pdtop: starting the engine (log: {log_path})", file=sys.stderr, flush=True)
    try:
        child, url = start_server(args, token, log_file, Progress())
    except (RuntimeError, OSError) as exc:
        log_file.close()
        refused = [line for line in _tail(log_path).splitlines() if line.startswith(SERVE_ERROR)]
        if refused:  # bad input the checks above could not see (e.g. a tensor type): the child's one line
            log_path.unlink(missing_ok=True)
            return fail("dashboard", refused[-1][len(SERVE_ERROR):])
        code = fail("dashboard", exc, code=1)
        print(_tail(log_path), file=sys.stderr, end="")
        return code
    code = 0
    try:
        code = _watch(child, url, token, args, log_path)
    finally:
        if child.poll() is None:
            print("pdtop: stopping the engine…", file=sys.stderr, flush=True)
        stop_server(child)
        log_file.close()
    if child.returncode not in (0, -signal.SIGTERM) or code:
        print(f"pdtop dashboard: the engine's log: {log_path}\n{_tail(log_path)}", file=sys.stderr, end="")
        return code or 1
    log_path.unlink(missing_ok=True)
    return 0


def _watch(child: subprocess.Popen, url: str, token: str, args: argparse.Namespace, log_path: Path) -> int:
    """Run the dashboard on the child's URL; tell the operator if the child exits under it."""
    from pdtop.telemetry.sources.live import LiveSource
    from pdtop.ui.launch import exit_code, make_app

    app = make_app(LiveSource(url, token=token), args)  # the server's hello says what it records

    def waiter() -> None:
        code = child.wait()
        if app.is_running:  # the dashboard stops the child only after it has quit
            message = f"the engine process exited (code {code}); log: {log_path}"
            try:
                app.call_from_thread(app.notify, message, title="engine stopped", severity="error", timeout=60)
            except RuntimeError:
                pass

    threading.Thread(target=waiter, name="pdtop-serve-wait", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: app.exit())
    app.run()
    return exit_code(app, "dashboard")
