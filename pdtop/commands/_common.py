"""What every command shares: the one-line error and the errors that mean bad input."""
from __future__ import annotations

import sys

from pdtop.engine.errors import EngineError

# Bad input a command reports as one line: the engine's errors, and files it cannot read.
INPUT_ERRORS: tuple[type[BaseException], ...] = (EngineError, OSError)

# --device of the commands that start an engine and its workload (`build.parse_device` reads it).
DEVICE_HELP = "cpu, cuda, or sim:GPU (H100, H200, A100, H20, custom:...); default: cuda if present, else cpu"


def fail(command: str, problem: str | BaseException, code: int = 2) -> int:
    """Print `pdtop COMMAND: error: PROBLEM` (its first line) to stderr and return `code`."""
    text = str(problem).strip().splitlines()
    print(f"pdtop {command}: error: {text[0] if text else type(problem).__name__}", file=sys.stderr)
    return code
