"""Live tuning on the dashboard: the candidates as they are measured, then keep the best or roll back.

The panel sits at the bottom, so the ITL chart above it shows each candidate's change as it is
applied. `k` keeps the best, `r` (or escape, also mid-run) restores what was in force before.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from pdtop.tune.report import describe_config, trial_table
from pdtop.ui.live_tune import LiveTune, NotMeasured


class TuneScreen(ModalScreen[str]):
    """Dismissed with the operator's choice, "kept" or "rolled back", which is then sent to the engine;
    `detach` stops the events reaching the tuner once the engine has confirmed the choice."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "keep", "keep best", id="tune.keep"),
        Binding("r", "rollback", "roll back", id="tune.rollback"),
        Binding("escape", "rollback", "stop, roll back", id="tune.escape"),
    ]
    DEFAULT_CSS = """
    TuneScreen { align: center bottom; background: $background 20%; }
    TuneScreen > Vertical {
        width: 100%; height: auto; max-height: 60%; padding: 0 1;
        border: round $accent; background: $surface;
    }
    TuneScreen Static { width: 100%; height: auto; }
    TuneScreen Label.hint { color: $text-muted; }
    """

    def __init__(self, tuner: LiveTune, detach: Callable[[], None]) -> None:
        super().__init__()
        self.tuner, self.detach = tuner, detach
        self.error: str | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._choosing = False
        self._finished = False  # the run returned (its task may still be ending)

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"live tuning · ITL SLO {self.tuner.slo.itl_s * 1e3:g} ms"
            yield Static(id="tune-table")
            yield Label(id="tune-status")
            yield Label("k: keep the best · r / escape: roll back to the configuration before", classes="hint")

    def on_mount(self) -> None:
        self._run_task = asyncio.create_task(self._run())
        self.refresh_view()

    def on_unmount(self) -> None:
        if not self._choosing:  # the app quit mid-run
            if self._run_task is not None:
                self._run_task.cancel()
            self.detach()

    async def _run(self) -> None:
        try:
            await self.tuner.run(self.refresh_view)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a refused set, a lost connection: shown, and the choice stays open
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._finished = True
        self.refresh_view()

    @property
    def running(self) -> bool:
        return self._run_task is not None and not self._run_task.done() and not self._finished

    def refresh_view(self) -> None:
        t = self.tuner
        best = t.best
        marks = {id(best): "*"} if best is not None else {}
        self.query_one("#tune-table", Static).update(Text("\n".join(trial_table(t.trials, t.slo, marks))))
        if self.error:
            status = f"stopped: {self.error}"
        elif self.running:
            doing = f"{t.status} {describe_config(t.current)}" if t.current is not None else t.status
            status = f"candidate {len(t.trials) + 1}: {doing}"
        elif best is not None:
            status = f"{t.status}: best goodput within the SLO is {describe_config(best.config)}"
        else:
            status = f"{t.status}: no configuration met the SLO"
        self.query_one("#tune-status", Label).update(status)

    def _choose(self, keep: bool) -> None:
        """Close at once (the first key decides); the choice is sent once the run has stopped."""
        if self._choosing:
            return
        self._choosing = True
        if self._run_task is not None:
            self._run_task.cancel()
        choice = _apply_choice(self.app, self.tuner, keep, self._run_task, self.detach)
        self.app.run_worker(choice, group="tune", exit_on_error=False)
        self.dismiss("kept" if keep else "rolled back")

    def action_keep(self) -> None:
        self._choose(keep=True)

    def action_rollback(self) -> None:
        self._choose(keep=False)


async def _apply_choice(app: App[None], tuner: LiveTune, keep: bool, run: asyncio.Task[None] | None,
                        detach: Callable[[], None]) -> None:
    """Wait for the stopped run, then keep the best or roll back, and say so once the engine has it in force."""
    if run is not None:
        await asyncio.gather(run, return_exceptions=True)
    try:
        if keep:
            try:
                kept = await tuner.keep()
            except NotMeasured as exc:
                await tuner.rollback()
                app.notify(f"nothing kept: {exc}; rolled back to the configuration before", title="live tuning",
                           severity="warning", timeout=10)
                return
            app.notify(f"kept {describe_config(kept)}", title="live tuning")
        else:
            await tuner.rollback()
            app.notify("rolled back to the configuration before", title="live tuning")
    except Exception as exc:
        app.notify(f"{'keep' if keep else 'roll back'} failed: {exc}", title="live tuning", severity="error",
                   timeout=10)
    finally:
        detach()
