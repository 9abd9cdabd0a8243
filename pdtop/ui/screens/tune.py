"""Live tuning on the dashboard: the candidates as they are measured, then keep the best or roll back.

The panel sits at the top, over the split and requests panels and never over the timeline: the
timeline's lanes (the split band, the decode steps) and the step chart below show each candidate's
change as it is applied. Where the candidates do not all fit, the latest and the best are listed and a
line says how many earlier ones are not. `k` keeps the best, `r` (or escape, also mid-run) restores
what was in force before.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from pdtop.tune.report import describe_config, trial_table
from pdtop.tune.search import Trial
from pdtop.ui.live_tune import LiveTune, NotMeasured

BOX_TOP = 2  # the header and the status line stay in view


class TuneScreen(ModalScreen[str]):
    """Dismissed with the operator's choice, "kept" or "rolled back", which is then sent to the engine;
    `detach` stops the events reaching the tuner once the engine has confirmed the choice."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "keep", "keep best", id="tune.keep"),
        Binding("r", "rollback", "roll back", id="tune.rollback"),
        Binding("escape", "rollback", "stop, roll back", id="tune.escape"),
    ]
    DEFAULT_CSS = """
    TuneScreen { align: center top; background: $background 20%; }
    TuneScreen > Vertical {
        width: 100%; height: auto; margin-top: 2; padding: 0 1;
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
        self._fit()
        self.refresh_view()

    def on_resize(self) -> None:
        self._fit()
        self.refresh_view()

    @property
    def room(self) -> int:
        """Rows the panel may take: from under the header and the status line down to the timeline."""
        main = self.app.screen_stack[0]
        try:
            top = main.query_one("#timeline").region.y
        except NoMatches:
            top = self.size.height
        return max(6, top - BOX_TOP)

    def _fit(self) -> None:
        self.query_one(Vertical).styles.max_height = self.room

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
        rows = self.room - 5  # the border, the table's head, the status and the hint
        shown = t.trials if len(t.trials) <= rows else _latest_and_best(t.trials, best, rows - 1)
        lines = trial_table(shown, t.slo, marks)
        if len(shown) < len(t.trials):
            lines.append(f"  … {len(t.trials) - len(shown)} earlier candidates not listed (* the best is)")
        self.query_one("#tune-table", Static).update(Text("\n".join(lines)))
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


def _latest_and_best(trials: list[Trial], best: Trial | None, rows: int) -> list[Trial]:
    """The latest `rows` trials in order, with the best one among them (in place of the oldest)."""
    rows = max(1, rows)
    latest = trials[-rows:]
    if best is None or any(t is best for t in latest):
        return latest
    return [best, *latest[1:]] if rows > 1 else [best]


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
