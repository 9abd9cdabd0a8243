"""The pdtop dashboard: one Textual app for live, replayed and scraped sources.

Events are taken at full rate into `DashboardState` by one task; the panels repaint from it
on a fixed tick (toolong style), so a fast engine costs ingest, not painting. Keys, the
footer, the help screen and the palette come from the one key table (`keymap`), run by
`DispatchApp`; the replay keys are `ReplayActions`; what an event tells the operator is
`notices`, the status line `status_text`.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult, SystemCommand
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from pdtop.telemetry.events import Hello
from pdtop.telemetry.sources.source import Source
from pdtop.ui.notices import notice_for
from pdtop.ui.replay_actions import ReplayActions
from pdtop.ui.screens.fleet import FleetScreen
from pdtop.ui.screens.tune import TuneScreen
from pdtop.ui.state import DashboardState
from pdtop.ui.status_text import Shown, status_text
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
from pdtop.visible import visible

MAX_NOTICE_CHARS = 2000  # a line of a notice; the status line shows one line, cut to the width


class PdtopApp(ReplayActions):
    """`PdtopApp(source)`; `source` is a `LiveSource`, `ReplaySource` or `PrometheusSource` (pdtop.telemetry)."""

    TITLE = "pdtop"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, source: Source, *, theme: str | None = None, interval_s: float = 0.1,
                 slo_ms: float | None = None, themes_dirs: list[Path] | None = None) -> None:
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
        super().__init__(source)
        if slo_ms:
            self.state.itl_slo_s = slo_ms / 1e3
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
        in `notices` (the last 100). A message may quote a server or a file (an error's reason, a client's
        name): each line is shown with its control characters visible, and cut to 2,000 characters."""
        message = "\n".join(visible(line, MAX_NOTICE_CHARS) for line in message.splitlines())
        title = visible(title, 200)
        self.notices.append((severity, title, message))
        try:
            status = self.screen_stack[0].query_one(StatusLine)
        except (NoMatches, IndexError):  # not mounted yet, or shutting down
            return
        status.show(severity, title, message, timeout or (8.0 if severity == "error" else 4.0))
        self.repaint_soon()

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
        self.theme_changed_signal.subscribe(self, lambda _theme: self.repaint_soon())
        self._fit_layout(*self.size)
        self._tick()

    async def on_unmount(self) -> None:
        try:
            await asyncio.wait_for(self.source.close(), 3.0)
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
        self.repaint_soon()

    def _fit_layout(self, width: int, height: int) -> None:
        """Size classes for app.tcss: -short (under 36 rows), -tiny (under 28), -narrow (under 110 columns),
        -no-palette-key (under 130: the footer's keys need the room; ctrl+p still works and help lists it)."""
        self.set_class(height < 36, "-short")
        self.set_class(height < 28, "-tiny")
        self.set_class(width < 110, "-narrow")
        self.set_class(width < 130, "-no-palette-key")

    def repaint_soon(self) -> None:
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
                    if self.state.fleet is not None and not isinstance(self.screen, FleetScreen):
                        self.action_show_fleet()
                    if self.readonly != was_readonly:
                        was_readonly = self.readonly
                        self.refresh_bindings()
                elif (t := self.source.transport) is not None and t.catching_up:
                    continue  # the window before a seek point: its changes were told when they happened
                elif notice := notice_for(event, self.state, dropped_before):
                    self.notify(notice.message, title=notice.title, severity=notice.severity, timeout=notice.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a source that fails is shown, not swallowed
            self.source_error = self.source.last_error or f"{type(exc).__name__}: {exc}"  # the source's words
            self.notify(self.source_error, title="event source failed", severity="error", timeout=30)
        self.repaint_soon()

    @property
    def connection(self) -> str:
        return self.source.state

    def status_text(self) -> Text:
        """The status line between notices (`ui.status_text`)."""
        hint = self.screen_stack[0].query_one(BandwidthPanel).hint_hidden if self.screen_stack else None
        shown = Shown(self.readonly, self.frozen is not None, hint, self.size.width,
                      self.theme_variables.get("warning", ""), self.source_error)
        return status_text(self.state, self.source, shown)

    # ---- repaint ----------------------------------------------------------------------------

    def _tick(self) -> None:
        if not self.screen_stack or isinstance(self.screen, FleetScreen):  # shutting down; or the main screen is
            return  # under the fleet's table, which paints itself (popping it repaints: the key is forced below)
        main = self.screen_stack[0]  # the main screen, even under a modal one
        try:
            header, status = main.query_one(HeaderBar), main.query_one(StatusLine)
        except NoMatches:  # shutting down: the widgets are gone
            return
        status.paint(self.status_text())
        view = self.frozen or self.state
        transport = self.source.transport
        replay = replay_state(transport) if transport is not None else ()
        key = (view.version, self.connection, self.readonly, replay, self.state.itl_slo_s, self.frozen is None,
               self.state.recording, self.state.recording_known)
        if key == self._painted and not self._force_paint:
            return
        force, self._painted, self._force_paint = self._force_paint, key, False
        self.repaints += 1
        view.itl_slo_s, view.recording, view.recording_known = (self.state.itl_slo_s, self.state.recording,
                                                                 self.state.recording_known)
        header.paint(view, self.connection, self.readonly, frozen=self.frozen is not None, address=self.source.url)
        for panel in main.query(Panel):
            panel.paint(view, force)
        self.state.shown_level = view.level
        if self.state.pending_level == view.level:  # the pin a press asked for is on screen
            self.state.pending_level = None
        if transport is not None:
            main.query_one(ReplayBar).paint(transport)

    # ---- local actions ----------------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette: the key table, then one entry per theme."""
        yield from super().get_system_commands(screen)
        for name in sorted(self.pdtop_themes):
            yield SystemCommand(f"theme: {name}", "switch to this theme", partial(setattr, self, "theme", name))

    def action_show_fleet(self) -> None:
        """Show the fleet's table (over the main screen, which shows the server chosen there)."""
        if self.state.fleet is not None and not isinstance(self.screen, FleetScreen):
            self.push_screen(FleetScreen())

    def on_key(self, event: events.Key) -> None:
        """Escape on a fleet server's view goes back to the fleet (not a key of the command table: it is
        the fleet screen's way back, as Enter there is the way in)."""
        if event.key == "escape" and self.state.fleet is not None and self.screen is self.screen_stack[0]:
            event.stop()
            self.action_show_fleet()

    def action_toggle_freeze(self) -> None:
        """Freeze the screen on what it shows now (events are still taken), or follow the engine again."""
        self.frozen = None if self.frozen is not None else self.state.snapshot()
        self.repaint_soon()

    def action_set_slo(self, value: float | None) -> None:
        self.state.itl_slo_s = value
        self.repaint_soon()

    def action_tune(self, value: tuple[float, float]) -> None:
        """Start live tuning (`pdtop.ui.live_tune`) with (ITL SLO seconds, seconds per candidate)."""
        from pdtop.tune.score import Slo
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
