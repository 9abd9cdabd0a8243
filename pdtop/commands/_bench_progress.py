"""`pdtop bench`'s progress on stderr: a rich progress bar with an ETA on a terminal, plain lines
otherwise. Each policy has `1 + long_prompts` stages (its decode batch running, then each long
prompt); `run_bench` says one message per stage."""
from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class BenchProgress:
    """Use as a context manager; `starting(policy)` before an engine is built, `__call__(message)`
    for each stage `run_bench` reports."""

    def __init__(self, policies: list[str], stages_per_policy: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self._bar = Progress(TextColumn("bench {task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                             disable=not self.live)
        self._task = self._bar.add_task("starting", total=len(policies) * stages_per_policy)

    def __enter__(self) -> BenchProgress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.stop()

    def starting(self, policy: str) -> None:
        """An engine is being built (the first loads the model): said at once on the bar (not in the
        plain lines, where an error about the engine is then the only line)."""
        if self.live:
            self._bar.update(self._task, description=f"{policy}: starting the engine")

    def __call__(self, message: str) -> None:
        self._bar.advance(self._task)
        self._say(message)

    def _say(self, message: str) -> None:
        if self.live:
            self._bar.update(self._task, description=message.split(":")[0] + ": " + _stage(message))
            self._bar.console.print(f"bench {message}", style="dim", highlight=False)
        else:
            print(f"bench {message}", file=sys.stderr, flush=True)


def _stage(message: str) -> str:
    """The short stage name for the bar (`long prompt 3/8`)."""
    parts = message.split(": ")
    return parts[1] if len(parts) > 1 else message
