"""Ctrl+C as a user presses it: a real SIGINT to a real `pdtop` subprocess."""
from __future__ import annotations

import signal
import subprocess
import time


def interrupt(cmd: list[str], ready) -> tuple[int, str, str]:
    """Run `cmd`, send SIGINT (Ctrl+C) once `ready(proc)` holds, and return (rc, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready(proc):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err
