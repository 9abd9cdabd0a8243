"""Live control's queue and outcome: each command waits here with a future until the engine's thread
takes it at a round boundary, checks it once against the state it meets, applies it and resolves the
future with the typed `Change` (or a `ControlError`, nothing changed).

Making a command (`scheduling/commands.py`) checked everything that does not depend on the engine's
state; nothing is checked here when it is queued. At most `MAX_PENDING` commands wait (the
telemetry server lets each connection have 16); past that, the future is refused at once.
`Settings` is what commands change, as the engine holds it; a `Change` is the settings before and
after one command, and its `changes` are the `config` event's (protocol v1), derived from the
settings' fields.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import EngineCommand, Inject
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

MAX_PENDING = 4096  # commands waiting for a round boundary, from every caller together


@dataclass(frozen=True)
class Settings:
    """What control commands change, as the engine holds it: the pdmux knobs, the split levels as the
    device realized them, the pin, the policy, the workload's rate and pause (None: no workload)."""

    pdmux: PdmuxConfig
    levels: tuple[tuple[int, int], ...]
    pinned_level: int | None
    policy: str
    workload_rate: float | None
    workload_paused: bool | None


_PDMUX_FIELDS = tuple(f.name for f in dataclasses.fields(PdmuxConfig) if f.compare)  # not `source`
_OTHER_FIELDS = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "pdmux")


@dataclass(frozen=True)
class Change:
    """What one applied command changed: the settings before and after it, and the inject it made."""

    before: Settings
    after: Settings
    inject: Inject | None = None

    @property
    def changes(self) -> dict[str, dict[str, Any]]:
        """`field -> {"old": ..., "new": ...}` for each setting that differs (the pdmux knobs by name, then
        levels, pinned_level, policy, workload_rate, workload_paused), then `inject`; empty when the
        command changed nothing (a pin to the level already pinned)."""
        out: dict[str, dict[str, Any]] = {}
        pairs = [(getattr(self.before.pdmux, n), getattr(self.after.pdmux, n), n) for n in _PDMUX_FIELDS]
        pairs += [(getattr(self.before, n), getattr(self.after, n), n) for n in _OTHER_FIELDS]
        for old, new, name in pairs:
            if old != new:
                out[name] = {"old": _plain(old), "new": _plain(new)}
        if self.inject is not None:
            out["inject"] = {"old": None, "new": self.inject.prompt_tokens or "default"}
        return out


def _plain(value: Any) -> Any:
    """Tuples as lists, as the wire writes them."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


@dataclass(eq=False)
class Pending:
    command: EngineCommand
    client: str | None  # who asked
    future: Future[Change]


class ControlQueue:
    """Commands from any thread, in order; the engine's thread takes them at round boundaries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[Pending] = deque()

    def put(self, command: EngineCommand, client: str | None) -> Future[Change]:
        future: Future[Change] = Future()
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                future.set_exception(ControlError(command.subject, f"{MAX_PENDING} commands already wait for the "
                                                                   "engine's next round; nothing was changed"))
            else:
                self._pending.append(Pending(command, client, future))
        return future

    def __len__(self) -> int:
        return len(self._pending)

    def head(self) -> Pending | None:
        """The oldest command waiting (it stays queued until `pop`)."""
        with self._lock:
            return self._pending[0] if self._pending else None

    def pop(self) -> None:
        with self._lock:
            self._pending.popleft()

    def fail_all(self, reason: str) -> None:
        """The engine closes: every command still waiting is refused."""
        with self._lock:
            pending, self._pending = self._pending, deque()
        for p in pending:
            resolve(p.future, ControlError("cmd", reason))


def resolve(future: Future[Change], outcome: Change | ControlError) -> None:
    """Set `future`'s outcome, unless its caller cancelled it meanwhile."""
    try:
        if isinstance(outcome, Change):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)
    except InvalidStateError:
        pass
