"""The pdtop dashboard: one Textual app for live and replayed sources.

Events are taken at full rate into `DashboardState` by one worker; the panels repaint
from it on a fixed tick (toolong style), so a fast engine costs ingest, not painting.
Every key, the footer, the help screen and the command palette come from the one
command table in `pdtop.ui.commands`.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from pdtop.telemetry.events import ConfigEvent, Dropped, ErrorNotice, Hello
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.telemetry.sources.source import ControlRefused, Source
from pdtop.ui.commands import BY_ID, COMMANDS, SPEEDS, Command
from pdtop.ui.screens.choice import ChoiceScreen
from pdtop.ui.screens.help import HelpScreen
from pdtop.ui.screens.prompt import PromptScreen
from pdtop.ui.screens.tune import TuneScreen
from pdtop.ui.state import DashboardState
from pdtop.ui.themes import DEFAULT_THEME, default_variables, load_themes
from pdtop.ui.widgets.bandwidth import BandwidthPanel
from pdtop.ui.widgets.base import Panel
from pdtop.ui.widgets.header import HeaderBar
from pdtop.ui.widgets.prefill import PrefillPanel
from pdtop.ui.widgets.replay_bar import ReplayBar, replay_state
from pdtop.ui.widgets.requests import RequestsPanel
from pdtop.ui.widgets.split import SplitPanel
from pdtop.ui.widgets.status_line import StatusLine
from pdtop.ui.widgets.step_time import StepTimePanel
from pdtop.ui.widgets.timeline import TimelinePanel
from pdtop.ui.words import asked, change_words, starved_side


def _bindings(commands: list[Command]) -> list[BindingType]:
    """One binding per command; help and quit first, so a narrow footer still shows them."""
    commands = sorted(commands, key=lambda c: c.id not in ("help", "quit"))
    return [Binding(c.key, f"run_command('{c.id}')", c.label, show=c.footer, key_display=c.key_display,
                    id=f"pdtop.{c.id}", tooltip=c.description) for c in commands]


class PdtopApp(App[None]):
    """`PdtopApp(source)`; `source` is a `LiveSource` or a `ReplaySource` (pdtop.telemetry)."""

    TITLE = "pdtop"
    CSS_PATH = "app.tcss"
    BINDINGS = _bindings(COMMANDS)
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, source: Source, *, theme: str | None = None, interval_s: float = 0.1,
                 slo_ms: float | None = None, themes_dirs: list[Path] | None = None,
                 recording: str | None = None) -> None:
        self.source = source
        self.replay_source = source if isinstance(source, ReplaySource) else None  # for the transport keys
        self.replay = self.replay_source is not None
        self.state = DashboardState()
        self.state.recording = recording  # a recording the server was started with (no event announces it)
        if slo_ms:
            self.state.itl_slo_s = slo_ms / 1e3
        self.interval_s = interval_s
        self.frozen: DashboardState | None = None  # the state on screen while the screen is frozen
        self.pdtop_themes = load_themes(themes_dirs)
        self._initial_theme = theme or DEFAULT_THEME
        self._painted: tuple[Any, ...] = ()
        self._force_paint = True
        self.source_error: str | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self.repaints = 0  # ticks that found something to repaint
        self.notices: deque[tuple[str, str, str]] = deque(maxlen=100)  # (severity, title, message) shown
        self.event_listeners: list[Callable[[Any], None]] = []  # also given every decoded event (live tuning)
        super().__init__()
        for t in self.pdtop_themes.values():
            self.register_theme(t)
        if self._initial_theme not in self.available_themes:
            known = ", ".join(sorted(self.available_themes))
            raise ValueError(f"unknown theme {self._initial_theme!r}; known: {known}")
        self.theme = self._initial_theme

    # ---- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield StatusLine(id="status")
        with Horizontal(id="row-top"):
            yield SplitPanel(id="split")
            yield RequestsPanel(id="requests")
        with Horizontal(id="row-mid"):
            yield StepTimePanel(id="steps")
            yield BandwidthPanel(id="bandwidth")
        yield TimelinePanel(id="timeline")
        yield PrefillPanel(id="prefill")
        if self.replay:
            yield ReplayBar(id="replay-bar")
        yield Footer()

    def notify(self, message: str, *, title: str = "", severity: str = "information", timeout: float | None = None,
               **_kwargs: Any) -> None:
        """Show a message on the status line under the header (never over the panels), and keep it
        in `notices` (the last 100)."""
        self.notices.append((severity, title, message))
        try:
            status = self.screen_stack[0].query_one(StatusLine)
        except (NoMatches, IndexError):  # not mounted yet, or shutting down
            return
        status.show(severity, title, message, timeout or (8.0 if severity == "error" else 4.0))
        self._repaint_soon()

    def repaint(self) -> None:
        """Repaint every panel now (the tick does this when something changed)."""
        self._force_paint = True
        self._tick()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return default_variables()

    def on_mount(self) -> None:
        # A plain task, not a worker: workers are cancelled before unmount, and a live source
        # should be closed (a clean websocket close) before its reader goes away.
        self._pump_task = asyncio.create_task(self._pump(), name="pdtop-events")
        self.set_interval(self.interval_s, self._tick, name="pdtop-repaint")
        self.theme_changed_signal.subscribe(self, lambda _theme: self._repaint_soon())
        self._fit_layout(*self.size)
        self._tick()

    async def on_unmount(self) -> None:
        close = getattr(self.source, "close", None)
        try:
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    await asyncio.wait_for(result, 3.0)
        except (asyncio.TimeoutError, OSError):
            pass
        task = self._pump_task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(task, 1.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout(event.size.width, event.size.height)
        self._repaint_soon()

    def _fit_layout(self, width: int, height: int) -> None:
        """Size classes for app.tcss: -short (under 36 rows), -tiny (under 28), -narrow (under 110 columns),
        -no-palette-key (under 130: the footer's keys need the room; ctrl+p still works and help lists it)."""
        self.set_class(height < 36, "-short")
        self.set_class(height < 28, "-tiny")
        self.set_class(width < 110, "-narrow")
        self.set_class(width < 130, "-no-palette-key")

    def _repaint_soon(self) -> None:
        self._force_paint = True
        self.call_after_refresh(self._tick)

    # ---- events in ------------------------------------------------------------------------

    async def _pump(self) -> None:
        """Take every event into the state as it arrives; repaint happens on the tick."""
        was_readonly = self.readonly
        dropped_before = 0
        try:
            async for raw in self.source.events():
                event = self.state.ingest(raw)
                for listener in list(self.event_listeners):
                    listener(event)
                if isinstance(event, Hello):
                    dropped_before = self.state.dropped
                    if self.readonly != was_readonly:
                        was_readonly = self.readonly
                        self.refresh_bindings()
                elif isinstance(event, ConfigEvent):
                    if event.client != self.state.client_id:  # ours were said when the reply came
                        who = f"{event.client}: " if event.client else ""
                        self.notify(who + change_words(event.changes, self.state), title="changed", timeout=4)
                elif isinstance(event, Dropped) and dropped_before == self.state.dropped - event.count:
                    self.notify(f"the server skipped {event.count} events this dashboard did not take in time; "
                                "the charts have a gap there", title="dropped", severity="warning", timeout=8)
                elif isinstance(event, ErrorNotice):
                    self.notify(f"{event.field or 'engine'}: {event.reason}", title="pdtop server",
                                severity="error", timeout=8)
                elif event is None and self.state.invalid == 1:  # the first only: a server bug floods
                    self.notify(self.state.invalid_reason, title="unreadable event skipped", severity="warning",
                                timeout=8)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a source that fails is shown, not swallowed
            self.source_error = f"{type(exc).__name__}: {exc}"
            self.notify(self.source_error, title="event source failed", severity="error", timeout=30)
        self._repaint_soon()

    @property
    def connection(self) -> str:
        return self.source.state

    @property
    def readonly(self) -> bool:
        return self.replay or self.source.readonly or self.state.readonly

    def status_text(self) -> Text:
        """The status line between messages: why there is no connection, how to get controls, or
        what runs (the workload) and where help is."""
        state, source = self.state, self.source
        url = getattr(source, "url", "")
        error, retry_at = getattr(source, "last_error", None), getattr(source, "retry_at", None)
        warning = self.theme_variables.get("warning", "")
        if self.connection in ("connecting", "reconnecting") and error:
            wait = max(0.0, retry_at - time.monotonic()) if retry_at is not None else None
            retry = f"retrying in {wait:.0f} s" if wait is not None and wait >= 0.5 else "retrying now"
            full = Text.assemble((f"cannot reach {url}: ", warning), error, ("  ·  ", "dim"), retry)
            if full.cell_len <= self.size.width - 2:
                return full
            return Text.assemble((error, warning), ("  ·  ", "dim"), retry)  # the address is in the header
        if self.connection == "connecting":
            return Text(f"connecting to {url}…", "dim")
        if self.connection == "closed" and not self.replay:
            return Text.assemble((f"disconnected from {url}", warning), (f": {self.source_error}" if
                                                                          self.source_error else "", ""))
        parts: list[Text] = []
        if self.frozen is not None:
            parts.append(Text("frozen: f follows the engine again (events are still taken)", "bold " + warning))
        elif not self.replay and self.readonly and not getattr(source, "want_readonly", True):
            parts.append(Text.assemble(("read-only: ", warning), "no control token; to control the engine, attach "
                                       "with --token TOKEN or set $PDTOP_TOKEN"))
        hint = self.screen_stack[0].query_one(BandwidthPanel).hint_hidden if self.screen_stack else None
        if hint:
            parts.append(Text(hint, "dim"))
        workload = state.info.workload
        for short in (False, True):  # narrow: the workload without its details, then without the help hint
            if workload and short:
                workload = re.sub(r" \([^)]*\)", "", workload)
            line = [*parts, Text.assemble(("workload ", "dim"), workload)] if workload else list(parts)
            text = Text("  ·  ", "dim").join([*line, Text("? help  ctrl+p commands", "dim")])
            if text.cell_len <= self.size.width - 2:
                return text
        return Text("  ·  ", "dim").join(line)  # the footer has `? help`

    # ---- repaint ----------------------------------------------------------------------------

    def _tick(self) -> None:
        main = self.screen_stack[0]  # the main screen, even under a modal one
        try:
            header, status = main.query_one(HeaderBar), main.query_one(StatusLine)
        except NoMatches:  # shutting down: the widgets are gone
            return
        status.paint(self.status_text())
        view = self.frozen or self.state
        replay = replay_state(self.replay_source) if self.replay_source is not None else ()
        key = (view.version, self.connection, self.readonly, replay, self.state.itl_slo_s, self.frozen is None,
               self.state.recording)
        if key == self._painted and not self._force_paint:
            return
        force, self._painted, self._force_paint = self._force_paint, key, False
        self.repaints += 1
        view.itl_slo_s, view.recording = self.state.itl_slo_s, self.state.recording
        address = str(getattr(self.source, "url", ""))
        header.paint(view, self.connection, self.readonly, frozen=self.frozen is not None, address=address)
        for panel in main.query(Panel):
            panel.paint(view, force)
        self.state.shown_level = view.level
        if self.replay_source is not None:
            main.query_one(ReplayBar).paint(self.replay_source)

    # ---- the command table -----------------------------------------------------------------

    def allowed(self, cmd: Command) -> bool:
        """Whether a command is offered here (mode, read-only)."""
        return cmd.available(self.replay) and not (cmd.needs_write and self.readonly)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run_command" and parameters:
            cmd = BY_ID.get(str(parameters[0]))
            return cmd is not None and self.allowed(cmd)
        return True

    def on_key(self, event: events.Key) -> None:
        """Keys of write commands on a read-only connection are refused out loud."""
        if not self.readonly or not isinstance(self.screen, Screen) or self.screen is not self.screen_stack[0]:
            return
        for cmd in COMMANDS:
            if cmd.key == event.key and cmd.needs_write and cmd.available(False):
                event.stop()
                self.refuse(cmd)
                return

    def refuse(self, cmd: Command) -> None:
        why = "a replay cannot change the engine" if self.replay else "this connection is read-only"
        self.notify(f"{cmd.description}: refused, {why}", title="read-only", severity="error")

    def action_run_command(self, command_id: str) -> None:
        cmd = BY_ID.get(command_id)
        if cmd is None:
            self.notify(f"no command {command_id!r}", severity="error")
            return
        if cmd.needs_write and self.readonly:
            self.refuse(cmd)
            return
        if not cmd.available(self.replay):
            self.notify(f"{cmd.description}: only when {'live' if cmd.mode == 'live' else 'replaying'}",
                        severity="warning")
            return
        if cmd.arg is None:
            self.execute(cmd, None)
        elif cmd.arg.choices:
            self.push_screen(ChoiceScreen(cmd.arg.prompt, cmd.arg.choices, cmd.arg.default(self.state)),
                             callback=partial(self._prompted, cmd))
        else:
            self.push_screen(PromptScreen(cmd.arg.prompt, cmd.arg.default(self.state)),
                             callback=partial(self._prompted, cmd))

    def _prompted(self, cmd: Command, text: str | None) -> None:
        if text is None:
            return
        assert cmd.arg is not None
        try:
            value = cmd.arg.parse(text)
        except ValueError as exc:
            self.notify(f"{cmd.description}: {exc}", title="not applied", severity="error")
            return
        self.execute(cmd, value)

    def execute(self, cmd: Command, value: Any) -> None:
        """Run a command with its (parsed) value: send its message, or run its local action."""
        if cmd.build is not None:
            try:
                msg = cmd.build(self.state, value)
            except ValueError as exc:
                self.notify(f"{cmd.description}: {exc}", title="not sent", severity="warning")
                return
            self.run_worker(self._send(cmd, msg), group="control", exit_on_error=False)
        elif cmd.arg is not None:
            getattr(self, f"action_{cmd.action}")(value)
        else:
            self.call_later(self.run_action, cmd.action or "")

    async def _send(self, cmd: Command, msg: dict[str, Any]) -> None:
        said = asked(msg, self.state)  # in words, from the state the operator saw when asking
        try:
            reply = await self.source.send(msg)
        except ControlRefused as exc:
            field = f"{exc.field}: " if exc.field else ""
            self.notify(f"{said}: {field}{exc.reason}", title="refused", severity="error", timeout=8)
            return
        except Exception as exc:
            self.notify(f"{said}: {type(exc).__name__}: {exc}", title="not sent", severity="error", timeout=8)
            return
        if msg["cmd"] == "record_start":
            self.state.recording = reply.path or msg["path"]
            self.notify(f"recording to {self.state.recording}", title="recording")
        elif msg["cmd"] == "record_stop":
            self.state.recording = None
            self.notify(f"saved {reply.path or ''}", title="recording stopped")
        elif msg["cmd"] == "pin_level" and (why := starved_side(self.state, msg["level"])):
            self.notify(f"{said}; {why}", title="accepted", severity="warning", timeout=8)
        else:
            self.notify(said, title="accepted", timeout=4)
        self.state.version += 1

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette: the command table (what is allowed here), then one entry per theme."""
        for cmd in COMMANDS:
            if self.allowed(cmd):
                yield SystemCommand(cmd.description, f"key: {cmd.key_display or cmd.key}",
                                    partial(self.action_run_command, cmd.id))
        for name in sorted(self.pdtop_themes):
            yield SystemCommand(f"theme: {name}", "switch to this theme", partial(setattr, self, "theme", name))

    # ---- local actions ----------------------------------------------------------------------

    def action_help(self) -> None:
        offered = [c for c in COMMANDS if self.allowed(c)]
        if self.replay:
            note = "replay: the engine cannot be changed"
        elif self.readonly:
            note = "read-only connection: engine controls are hidden"
        else:
            note = ""
        self.push_screen(HelpScreen(offered, note))

    def action_toggle_freeze(self) -> None:
        """Freeze the screen on what it shows now (events are still taken), or follow the engine again."""
        self.frozen = None if self.frozen is not None else self.state.snapshot()
        self._repaint_soon()

    def action_set_slo(self, value: float | None) -> None:
        self.state.itl_slo_s = value
        self._repaint_soon()

    def action_tune(self, value: tuple[float, float]) -> None:
        """Start live tuning (`pdtop.ui.live_tune`) with (ITL SLO seconds, seconds per candidate)."""
        from pdtop.analysis.tune import Slo
        from pdtop.ui.live_tune import LiveTune

        config = self.state.config
        if config is None or config.policy != "pdmux":
            self.notify("live tuning tunes pdmux: switch the policy to pdmux first", severity="warning")
            return
        slo_s, dwell_s = value
        tuner = LiveTune(self.source.send, config, Slo(slo_s), dwell_s=dwell_s, settle_s=min(0.5, dwell_s / 2))
        self.event_listeners.append(tuner.on_event)
        self.push_screen(TuneScreen(tuner, detach=lambda: self.event_listeners.remove(tuner.on_event)))

    def action_next_theme(self) -> None:
        names = sorted(self.pdtop_themes) or [self.theme]
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_replay_toggle(self) -> None:
        src = self.replay_source
        if src is None:
            return
        if src.at_end:  # play again from the start
            src.seek(0.0)
            src.resume()
        elif src.paused:
            src.resume()
        else:
            src.pause()
        self._repaint_soon()

    def action_replay_step(self) -> None:
        if self.replay_source is not None:
            self.replay_source.step()
            self._repaint_soon()

    def action_replay_seek(self, t: float) -> None:
        if self.replay_source is not None:
            self.replay_source.seek(t)
            self._repaint_soon()

    def action_replay_seek_relative(self, delta: float) -> None:
        if self.replay_source is not None:
            self.action_replay_seek(self.replay_source.position + delta)

    def action_replay_speed(self, direction: int) -> None:
        src = self.replay_source
        if src is None:
            return
        options = [s for s in SPEEDS if (s > src.speed if direction > 0 else s < src.speed)]
        if not options:
            self.notify(f"speed stays {src.speed:g}x (0.25x to 16x)", severity="warning", timeout=2)
            return
        src.speed = min(options) if direction > 0 else max(options)
        self._repaint_soon()
