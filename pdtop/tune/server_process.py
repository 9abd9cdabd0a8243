"""Server supervision: start an inference server from a command line, wait until it serves, tell
whether it died, and stop it for sure.

What `pdtop tune --launch CMD` does for each candidate, as vLLM's `benchmarks/auto_tune` does
by hand: CMD is split into words as a shell would, and `{config}`, `{port}` and `{control_port}`
in each word are replaced by the candidate's YAML file and free loopback ports (`substitute`: no
shell reads them); the program runs in its own session (its own process group, so a terminal's
Ctrl+C reaches pdtop only and pdtop stops the whole group); its stdout and stderr go to a log
file. Ready means `GET /health` then `GET /v1/models`
answer 200. Stopping sends SIGTERM to the group, SIGKILL after a grace period, and waits
until nothing listens on the port.

Every started server is registered until it is stopped; `stop_all` (called on exit, and by
`signals_as_exit` on SIGTERM/SIGHUP) stops what is left, so no server outlives pdtop; should
pdtop be killed outright, a watchdog process (`REAPER`) stops the group.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from pdtop.engine.errors import EngineError

LOG_TAIL_LINES = 20
STOP_GRACE_S = 10.0
PORT_FREE_TIMEOUT_S = 30.0
_RUNNING: set[Server] = set()
# A watchdog per server, in its own session: when its stdin (a pipe only pdtop holds) closes, pdtop
# is done with the server or gone (even by SIGKILL), and the watchdog stops the server's group.
REAPER = """import os, signal, sys, time
group, grace = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.buffer.read()
def alive():
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
if alive():
    os.killpg(group, signal.SIGTERM)
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
    if alive():
        os.killpg(group, signal.SIGKILL)
"""


class LaunchError(EngineError):
    """A candidate's server did not start, crashed, or never got healthy (with its log's tail)."""

    def __init__(self, reason: str, log_tail: str = ""):
        super().__init__(reason)
        self.reason, self.log_tail = reason, log_tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on `port` (a bind with SO_REUSEADDR succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


PLACEHOLDERS = ("{config}", "{port}", "{control_port}")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./@%+=:,-]*")


def words_of(command: str) -> list[str]:
    """`command` split into words as a shell would: quotes, escapes, and a backslash before a newline
    continuing the line."""
    return shlex.split(command.replace("\\\n", ""))


def check_template(command: str) -> None:
    """ValueError (one line) unless `command` splits into words (shell quoting) and names `{port}`."""
    try:
        words = words_of(command)
    except ValueError as exc:
        raise ValueError(f"--launch: cannot parse the command: {exc}") from None
    if "{port}" not in command:
        raise ValueError("--launch: the command must contain {port} (and {config} where the engine reads "
                         "its pdmux YAML)")
    if not [w for w in words if not _ASSIGNMENT.match(w)]:
        raise ValueError("--launch: the command names no program")


@dataclass(frozen=True)
class Launch:
    """A command line with its placeholders filled: the program's arguments and the variables set before it."""

    argv: list[str]
    env: dict[str, str]

    def __str__(self) -> str:
        return shlex.join([f"{k}={v}" for k, v in self.env.items()] + self.argv)


def substitute(command: str, values: dict[str, str]) -> Launch:
    """`command` split into words as a shell would (`shlex`), then `{config}`, `{port}`, ... replaced in
    each word: a value is one argument whatever it holds, and no shell reads it, so no quoting in the
    template (`'{config}'`, `"{config}"`) lets a path such as `t;touch x;#` run anything. Leading
    `NAME=VALUE` words set variables, as in a shell. A template that runs a shell itself (`sh -c
    '... {config}'`) hands it the values as script text: ValueError unless each value is shell-safe."""
    words = words_of(command)

    def fill(word: str) -> str:
        for name, value in values.items():
            word = word.replace(name, value)
        return word

    n = 0
    while n < len(words) and _ASSIGNMENT.match(words[n]):
        n += 1
    env = dict(fill(w).split("=", 1) for w in words[:n])
    argv = [fill(w) for w in words[n:]]
    if os.path.basename(words[n]) in SHELLS:
        risky = [v for name, v in values.items() if any(name in w for w in words[n + 1:]) and
                 not _SHELL_SAFE.fullmatch(v)]
        if risky:
            raise ValueError(f"--launch: {words[n]} would read {risky[0]!r} as shell text; give the program "
                             "itself as the command (pdtop runs it without a shell), or a path without "
                             "shell characters")
    return Launch(argv, env)


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(eq=False)
class Server:
    """One launched server: its command, port, log file and process (the leader of its group)."""

    command: Launch
    port: int
    log_path: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(self.command.argv, env=os.environ | self.command.env,
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            except OSError as exc:  # no such program, not executable: as a shell's exit 127 would say
                raise self.fail(f"cannot run {self.command.argv[0]!r}: {exc.strerror or exc}") from None
        _RUNNING.add(self)
        self.reaper = subprocess.Popen([sys.executable, "-c", REAPER, str(self.proc.pid), str(STOP_GRACE_S)],
                                       stdin=subprocess.PIPE, start_new_session=True)

    def exited(self, wait_s: float = 0.0) -> int | None:
        """The exit status once the command has ended (waiting up to `wait_s` for it), else None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(wait_s) if wait_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def fail(self, reason: str) -> LaunchError:
        return LaunchError(reason, log_tail(self.log_path))

    def check_running(self, when: str) -> None:
        """LaunchError if the command has ended (`when`: "during the run", say)."""
        status = self.exited()
        if status is not None:
            raise self.fail(f"the server exited with status {status} {when}")

    def failed_request(self, exc: EngineError) -> LaunchError:
        """A request to the server failed with `exc`: that, and the exit status if the server died
        (waiting a second for it)."""
        status = self.exited(wait_s=1.0)
        return self.fail(str(exc) + (f" (the server exited with status {status})" if status is not None else ""))

    def wait_ready(self, timeout_s: float, poll_s: float = 0.25) -> float:
        """Seconds until `/health` and then `/v1/models` answered 200; LaunchError on exit or timeout."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=5.0) as client:
            for path in ("/health", "/v1/models"):
                while True:
                    status = self.exited()
                    if status is not None:
                        raise self.fail(f"the server exited with status {status} before it was ready")
                    try:
                        if client.get(self.url + path).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise self.fail(f"the server was not ready ({path} answering 200) within {timeout_s:g} s")
                    time.sleep(poll_s)
        return time.monotonic() - t0

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the group, SIGKILL after `grace_s`, then wait until the port is free."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the session leader: its pid is the group's id
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:  # children may outlive the shell
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait()
        _RUNNING.discard(self)  # only now: a stop cut short (a second Ctrl+C) is finished at exit
        if self.reaper is not None:  # its pipe closed, it finds the group gone and exits
            self.reaper.communicate()
            self.reaper = None
        deadline = time.monotonic() + PORT_FREE_TIMEOUT_S
        while not port_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace_s=2.0)


atexit.register(stop_all)


@contextlib.contextmanager
def signals_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (128 + signal) in the main thread while inside, so the
    `finally` that stops a server runs; Python's default would end the process on the spot."""
    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        stop_all()
        for sig, previous in old.items():
            signal.signal(sig, previous)
