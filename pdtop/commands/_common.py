"""What every command shares: the one-line error and the errors that mean bad input."""
from __future__ import annotations

import sys

from pdtop.engine.errors import EngineError

# Bad input a command reports as one line: the engine's errors, and files it cannot read.
INPUT_ERRORS: tuple[type[BaseException], ...] = (EngineError, OSError)


def fail(command: str, problem: str | BaseException, code: int = 2) -> int:
    """Print `pdtop COMMAND: error: PROBLEM` (its first line) to stderr and return `code`."""
    text = str(problem).strip().splitlines()
    print(f"pdtop {command}: error: {text[0] if text else type(problem).__name__}", file=sys.stderr)
    return code
