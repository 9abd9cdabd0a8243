"""Help: every command available here, from the command table, with its key; and how to call the server's API."""
from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pdtop.ui.keymap import KeyCommand


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "close", id="help.close"),
        Binding("question_mark", "close", "close", show=False, id="help.close2"),
        Binding("q", "close", "close", show=False, id="help.close3"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 80; max-width: 95%; height: auto; max-height: 90%; padding: 0 1;
        border: round $accent; background: $surface;
    }
    HelpScreen Static { width: 100%; height: auto; }
    """

    def __init__(self, commands: list[KeyCommand], note: str = "", api_text: str = "") -> None:
        """`api_text`: how to call the server's OpenAI-compatible API (its address and token), when it runs one."""
        super().__init__()
        self.commands, self.note, self.api_text = commands, note, api_text

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        table.add_column("key", style="bold")
        table.add_column("command")
        table.add_column("", style="dim")
        for cmd in self.commands:
            key = cmd.key_display or cmd.key
            table.add_row(key, cmd.description, "→ engine" if cmd.build else "")
        table.add_row("ctrl+p", "command palette (every command, searchable)", "")
        with VerticalScroll() as scroll:
            scroll.border_title = "pdtop help"
            if self.note:
                yield Static(Text(self.note, "italic"))
            yield Static(table)
            if self.api_text:
                yield Static(Text(self.api_text, "dim"))

    def action_close(self) -> None:
        self.dismiss(None)
