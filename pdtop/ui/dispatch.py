"""Running the key table (`keymap.KEYMAP`): bindings, read-only refusals, prompts for a value, the
command sent and what the operator is told of its reply, and the command palette.

`DispatchApp` is the part of the dashboard app that does this; `PdtopApp` adds the panels.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from functools import partial
from typing import Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen

from pdtop.engine.scheduling.commands import ENGINE_COMMANDS, AutoLevel, PinLevel
from pdtop.telemetry.server.commands import Command, RecordStart, RecordStop
from pdtop.telemetry.sources.live import LiveSource
from pdtop.telemetry.sources.source import ControlRefused, Source
from pdtop.ui.keymap import BY_ID, KEYMAP, KeyCommand
from pdtop.ui.screens.choice import ChoiceScreen
from pdtop.ui.screens.help import HelpScreen
from pdtop.ui.screens.prompt import PromptScreen
from pdtop.ui.state import DashboardState
from pdtop.ui.words import api_words, asked, change_words, shared_side

ALREADY_RECORDING = re.compile(r"already recording to (['\"])(.*)\1$")  # the server's refusal of a second start
QUEUED_S = 30.0  # how long "queued" may stay on the status line: its outcome replaces it


def bindings(keys: list[KeyCommand]) -> list[BindingType]:
    """One binding per key; help and quit first, so a narrow footer still shows them."""
    keys = sorted(keys, key=lambda c: c.id not in ("help", "quit"))
    return [Binding(c.key, f"run_command('{c.id}')", c.label, show=c.footer, key_display=c.key_display,
                    id=f"pdtop.{c.id}", tooltip=c.description) for c in keys]


class DispatchApp(App[None]):
    BINDINGS = bindings(KEYMAP)

    def __init__(self, source: Source) -> None:
        self.source = source
        self.state = DashboardState()
        super().__init__()

    @property
    def replay(self) -> bool:
        return self.source.transport is not None

    @property
    def readonly(self) -> bool:
        return self.replay or self.source.readonly or self.state.readonly

    def repaint_soon(self) -> None:
        """Repaint after the next refresh (the app's panels)."""

    def allowed(self, key: KeyCommand) -> bool:
        """Whether a key is offered here (mode, read-only)."""
        return key.available(self.replay) and not (key.needs_write and self.readonly)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run_command" and parameters:
            key = BY_ID.get(str(parameters[0]))
            return key is not None and self.allowed(key)
        return True

    def on_key(self, event: events.Key) -> None:
        """Keys of write commands on a read-only connection are refused out loud."""
        if not self.readonly or not isinstance(self.screen, Screen) or self.screen is not self.screen_stack[0]:
            return
        for key in KEYMAP:
            if key.key == event.key and key.needs_write and key.available(False):
                event.stop()
                self.refuse(key)
                return

    def refuse(self, key: KeyCommand) -> None:
        why = self.source.readonly_reason or "this connection is read-only"
        self.notify(f"{key.description}: refused, {why}", title="read-only", severity="error")

    def action_run_command(self, key_id: str) -> None:
        key = BY_ID.get(key_id)
        if key is None:
            self.notify(f"no command {key_id!r}", severity="error")
            return
        if key.needs_write and self.readonly:
            self.refuse(key)
            return
        if not key.available(self.replay):
            self.notify(f"{key.description}: only when {'live' if key.mode == 'live' else 'replaying'}",
                        severity="warning")
            return
        if key.arg is None:
            self.execute(key, None)
        elif key.arg.choices:
            self.push_screen(ChoiceScreen(key.arg.prompt, key.arg.choices, key.arg.default(self.state)),
                             callback=partial(self._prompted, key))
        else:
            self.push_screen(PromptScreen(key.arg.prompt, key.arg.default(self.state)),
                             callback=partial(self._prompted, key))

    def _prompted(self, key: KeyCommand, text: str | None) -> None:
        if text is None:
            return
        assert key.arg is not None
        try:
            value = key.arg.parse(text)
        except ValueError as exc:
            self.notify(f"{key.description}: {exc}", title="not applied", severity="error")
            return
        self.execute(key, value)

    def execute(self, key: KeyCommand, value: Any) -> None:
        """Run a key with its (parsed) value: send its command, or run its local action."""
        if key.build is not None:
            try:
                command = key.build(self.state, value)
            except ValueError as exc:
                self.notify(f"{key.description}: {exc}", title="not sent", severity="warning")
                return
            if isinstance(command, (PinLevel, AutoLevel)):
                self.state.pending_level = command.level if isinstance(command, PinLevel) else None
            self.run_worker(self._send(command), group="control", exit_on_error=False)
        elif key.arg is not None:
            getattr(self, f"action_{key.action}")(value)
        else:
            self.call_later(self.run_action, key.action or "")

    async def _send(self, command: Command) -> None:
        """Send `command`. An engine command is applied at the engine's next round boundary (a CPU
        round can take a second or more): "queued" is said at once, the outcome when its reply comes."""
        said = asked(command, self.state)  # in words, from the state the operator saw when asking
        if isinstance(command, tuple(ENGINE_COMMANDS.values())):  # the server's own are answered at once
            self.notify(said, title="queued", timeout=QUEUED_S)
        try:
            reply = await self.source.send(command)
        except ControlRefused as exc:
            self._not_pending(command)
            field = f"{exc.field}: " if exc.field else ""
            self.notify(f"{said}: {field}{exc.reason}", title="refused", severity="error", timeout=8)
            self._learn_recording(command, exc.reason)
            return
        except Exception as exc:
            self._not_pending(command)
            self.notify(f"{said}: {type(exc).__name__}: {exc}", title="not sent", severity="error", timeout=8)
            return
        done = said if reply.change is None else change_words(reply.change, self.state) or f"{said} (already so)"
        match command:
            case RecordStart(path=path):
                self.state.recording, self.state.recording_known = reply.path or path, True
                self.notify(f"recording to {self.state.recording}", title="recording")
            case RecordStop():
                self.state.recording, self.state.recording_known = None, True
                self.notify(f"saved {reply.path or ''}", title="recording stopped")
            case PinLevel(level=level) if why := shared_side(self.state, level):
                self.notify(f"{done}; {why}", title="applied", severity="warning", timeout=8)
            case _:
                self.notify(done, title="applied", timeout=4)
        self.state.version += 1

    def _not_pending(self, command: Command) -> None:
        """A pin that was not applied: + and - step from the screen again."""
        if isinstance(command, PinLevel) and self.state.pending_level == command.level:
            self.state.pending_level = None

    def _learn_recording(self, command: Command, reason: str) -> None:
        """A refused start or stop says what the server records (someone else started or stopped it)."""
        if isinstance(command, RecordStart) and (m := ALREADY_RECORDING.match(reason)):
            self.state.recording, self.state.recording_known = m.group(2), True
        elif isinstance(command, RecordStop) and reason == "not recording":
            self.state.recording, self.state.recording_known = None, True
        self.state.version += 1

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette: the key table (what is allowed here)."""
        for key in KEYMAP:
            if self.allowed(key):
                yield SystemCommand(key.description, f"key: {key.key_display or key.key}",
                                    partial(self.action_run_command, key.id))

    def action_help_quit(self) -> None:
        """Ctrl+C quits, as in every `top` (Textual's default only says to press ctrl+q instead). In a
        prompt's input it still copies: the input takes the key first."""
        self.exit()

    def action_help(self) -> None:
        offered = [c for c in KEYMAP if self.allowed(c)]
        if self.replay:
            note = "replay: the engine cannot be changed"
        elif self.readonly:
            note = "read-only connection: engine controls are hidden"
        else:
            note = ""
        token = self.source.token if isinstance(self.source, LiveSource) else None
        api = None if self.replay else self.state.api  # a recording's server is not there to call (as the header)
        self.push_screen(HelpScreen(offered, note, api_words(api, token, self.state.readonly)))
