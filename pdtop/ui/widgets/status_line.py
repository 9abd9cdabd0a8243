"""The line under the header: the latest notification for a few seconds, else what is going on
(the workload, why there is no connection, how to get controls). Messages never cover the panels."""
from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

SEVERITY = {"information": ("✔ ", "success"), "warning": ("▲ ", "warning"), "error": ("✖ ", "error")}


class StatusLine(Static):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._message: tuple[str, str, str] | None = None  # (severity, title, text)
        self._until = 0.0
        self._last: Text | None = None

    @property
    def text(self) -> str:
        """What the line shows now, as plain text."""
        return self._last.plain if self._last is not None else ""

    def show(self, severity: str, title: str, message: str, timeout: float) -> None:
        self._message = (severity, title, " · ".join(line for line in message.splitlines() if line))
        self._until = time.monotonic() + timeout

    def clear(self) -> None:
        """Drop the message shown now."""
        self._message = None

    def paint(self, idle: Text) -> None:
        """Show the current message, or `idle` once it has timed out."""
        text = idle
        if self._message is not None and time.monotonic() < self._until:
            severity, title, message = self._message
            mark, colour = SEVERITY.get(severity, SEVERITY["information"])
            style = self.app.theme_variables.get(colour, "")
            text = Text.assemble((mark, "bold " + style), (f"{title}: " if title else "", "bold " + style), message)
        else:
            self._message = None
        text.no_wrap, text.overflow = True, "ellipsis"
        if text != self._last:
            self._last = text
            self.update(text, layout=False)
