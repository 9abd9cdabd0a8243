"""The control queue: commands checked when they come (from any thread), applied at round boundaries.

`put` checks a command against the state it will meet: the engine's, with every change still
queued before it (`Plan`); a bad one raises ControlError and nothing is queued. The engine's
thread takes each queued change from `pending()` at a round boundary, checks it again against
the state it really meets, and applies it.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pdtop.engine.scheduling.commands import EngineCommand
from pdtop.engine.scheduling.control import Change, Plan, check
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable


@dataclass(frozen=True)
class Queued:
    change: Change
    client: str | None  # who asked


class ControlQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[Queued] = deque()
        self._plan: Plan | None = None  # the state once every queued change is applied; None: the current one

    def put(self, command: EngineCommand, client: str | None, *, config: PdmuxConfig, table: SplitTable,
            max_prompt: int, admit: Callable[[Change], None]) -> None:
        """Check `command` against the state it will meet (`config` and `table` if nothing is queued)
        and queue it; `admit(change)` runs before it is queued and may refuse it (ControlError)."""
        with self._lock:
            plan = self._plan or Plan(config, table)
            change = check(command, config=plan.config, table=plan.table, max_prompt=max_prompt)
            admit(change)
            self._pending.append(Queued(change, client))
            self._plan = plan.after(change)

    def pending(self) -> Iterator[Queued]:
        """Each queued change in order, on the engine's thread. A change stays queued (and planned)
        until the loop body that took it is done, so a `put` meanwhile is checked against it."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                queued = self._pending[0]
            yield queued
            with self._lock:
                self._pending.popleft()
                if not self._pending:
                    self._plan = None
