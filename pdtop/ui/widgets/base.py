"""Base class of the panels: a bordered Static that repaints from the state on the tick."""
from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

from pdtop.ui.state import DashboardState
from pdtop.ui.themes import PDTOP_COLOURS, variable


class Panel(Static):
    """A panel; subclasses implement `render_state`. The app calls `paint` on its tick.

    A repaint is skipped when `paint_key` (what the panel shows, plus size and theme) is
    unchanged, and asks for a layout pass only when the number of lines changed.
    """

    TITLE = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_key: Any = None
        self._last_lines = -1

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

    def paint_key(self, state: DashboardState) -> Any:
        """What decides this panel's picture; by default every event changes it."""
        return state.version

    def paint(self, state: DashboardState, force: bool = False) -> None:
        key = (self.paint_key(state), self.content_size, self.app.theme)
        if key == self._last_key and not force:
            return
        self._last_key = key
        renderable = self.render_state(state)
        lines = -1
        if isinstance(renderable, Group):
            lines = len(renderable.renderables)
            for line in renderable.renderables:  # one line each: cut, never wrap
                if isinstance(line, Text):
                    line.no_wrap, line.overflow = True, "ellipsis"
        self.update(renderable, layout=lines != self._last_lines)
        self._last_lines = lines

    def render_state(self, state: DashboardState) -> RenderableType:
        raise NotImplementedError
