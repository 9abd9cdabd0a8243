"""Pick one value from a list (the policy): arrows and Enter, or click; Escape cancels."""
from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


class ChoiceScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel", id="choice.cancel")]
    DEFAULT_CSS = """
    ChoiceScreen { align: center middle; }
    ChoiceScreen > Vertical {
        width: 90%; max-width: 80; height: auto; padding: 0 1;
        border: round $accent; background: $surface;
    }
    ChoiceScreen OptionList { height: auto; max-height: 12; border: none; padding: 0; }
    ChoiceScreen Label.hint { color: $text-muted; }
    """

    def __init__(self, prompt: str, choices: tuple[tuple[str, str], ...], current: str = "") -> None:
        super().__init__()
        self.prompt, self.choices, self.current = prompt, choices, current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.prompt)
            options = [Option(Text.assemble(("● " if value == self.current else "  ", "bold"), (f"{value:<14}", "bold"),
                                            meaning), id=value) for value, meaning in self.choices]
            yield OptionList(*options, id="choices")
            yield Label("↑↓ choose · enter: apply · escape: cancel", classes="hint")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        values = [value for value, _ in self.choices]
        options.highlighted = values.index(self.current) if self.current in values else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
