"""The fleet's table: one line per server under a header, a cursor (↑↓, page keys, home/end) and Enter
to choose. Each line is one `Text` built here, so a read of 16 servers repaints 16 short lines; a
`DataTable` re-rendered every cell of every row on each read (about a quarter of the dashboard's CPU
with 16 servers)."""
from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static


class FleetTable(VerticalScroll, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "up", show=False, id="fleet.up"),
        Binding("down", "move(1)", "down", show=False, id="fleet.down"),
        Binding("pageup", "page(-1)", "page up", show=False, id="fleet.pageup"),
        Binding("pagedown", "page(1)", "page down", show=False, id="fleet.pagedown"),
        Binding("home", "move(-100000)", "first", show=False, id="fleet.home"),
        Binding("end", "move(100000)", "last", show=False, id="fleet.end"),
        Binding("enter", "choose", "this server", show=False, id="fleet.enter"),
    ]
    DEFAULT_CSS = """
    FleetTable { height: 1fr; scrollbar-size-horizontal: 0; }
    FleetTable > Static { width: 100%; height: auto; }
    """

    class Chosen(Message):
        """Enter on a row: the server's key (its URL)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.keys: list[str] = []
        self.lines: list[Text] = []
        self.cursor_row = 0
        self._body = Static()

    def compose(self):  # type: ignore[no-untyped-def]
        yield self._body

    @property
    def row_count(self) -> int:
        return len(self.keys)

    def show(self, rows: list[tuple[str, Text]]) -> None:
        """Set the rows (key, line); the cursor stays on its server where it can."""
        chosen = self.keys[self.cursor_row] if self.keys and self.cursor_row < len(self.keys) else None
        self.keys, self.lines = [k for k, _ in rows], [line for _, line in rows]
        if chosen in self.keys:
            self.cursor_row = self.keys.index(chosen)
        self.cursor_row = min(self.cursor_row, max(0, len(self.keys) - 1))
        self._paint()

    def _paint(self) -> None:
        cursor_style = self.app.theme_variables.get("accent", "blue")
        shown = []
        for i, line in enumerate(self.lines):
            if i == self.cursor_row:
                line = line.copy()
                line.stylize(f"reverse {cursor_style}")
            shown.append(line)
        self._body.update(Text("\n").join(shown) if shown else Text("no servers yet", "dim"))

    def move_cursor(self, row: int) -> None:
        if not self.keys:
            return
        self.cursor_row = max(0, min(len(self.keys) - 1, row))
        self._paint()
        height = max(1, self.size.height)
        if self.cursor_row < self.scroll_y:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= self.scroll_y + height:
            self.scroll_to(y=self.cursor_row - height + 1, animate=False)

    def action_move(self, step: int) -> None:
        self.move_cursor(self.cursor_row + step)

    def action_page(self, pages: int) -> None:
        self.move_cursor(self.cursor_row + pages * max(1, self.size.height - 1))

    def action_choose(self) -> None:
        if self.keys:
            self.post_message(self.Chosen(self.keys[self.cursor_row]))
