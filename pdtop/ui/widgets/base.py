"""Base class of the panels: a bordered Static that repaints from the state on the tick."""
from __future__ import annotations

from rich.console import RenderableType
from textual.widgets import Static

from pdtop.ui.state import DashboardState
from pdtop.ui.themes import PDTOP_COLOURS, variable


class Panel(Static):
    """A panel; subclasses implement `render_state`. The app calls `paint` on its tick."""

    TITLE = ""

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    def colour(self, key: str) -> str:
        """One of pdtop's theme colours ("prefill", "decode", "idle", "slo", "chart") or a Textual one."""
        name = variable(key) if key in PDTOP_COLOURS else key
        return self.app.theme_variables.get(name) or PDTOP_COLOURS.get(key, "white")

    @property
    def inner_width(self) -> int:
        return max(10, self.content_size.width or 40)

    @property
    def inner_height(self) -> int:
        return max(1, self.content_size.height or 6)

    def paint(self, state: DashboardState) -> None:
        self.update(self.render_state(state))

    def render_state(self, state: DashboardState) -> RenderableType:
        raise NotImplementedError
