"""Replay transport: play state, speed, a position bar with time, and what of the file could not be read."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import Static

from pdtop import format as fmt
from pdtop.telemetry.sources.source import Transport


class ReplayBar(Static):
    """One line above the footer, shown only when replaying."""

    _source: Transport | None = None

    def on_resize(self, _event: events.Resize) -> None:
        """The bar fills the new width, paused or not."""
        if self._source is not None:
            self.paint(self._source)

    def paint(self, source: Transport) -> None:
        self._source = source
        colours = self.app.theme_variables
        position, duration = source.position, source.duration
        if source.at_end:
            status = ("■ end", "bold " + colours.get("warning", ""))
        elif source.paused:
            status = ("❚❚ paused", "bold " + colours.get("warning", ""))
        else:
            status = ("▶ playing", "bold " + colours.get("success", ""))
        head = Text.assemble(status, f"  {source.speed:g}x  ", (fmt.clock(position), "bold"), " / ",
                             fmt.clock(duration), "  ")
        problems = source.problems
        if problems:  # lines skipped or cut, a damaged file, events of a protocol this pdtop does not read
            head.append("⚠ " + "; ".join(problems) + "  ", style=colours.get("warning", ""))
        width = max(10, (self.content_size.width or 80) - head.cell_len)
        frac = position / duration if duration > 0 else 0.0
        done = min(width - 1, int(frac * (width - 1)))
        bar = Text.assemble(("━" * done, colours.get("primary", "")), ("●", "bold " + colours.get("accent", "")),
                            ("─" * (width - 1 - done), "dim"))
        self.update(head + bar, layout=False)


def replay_state(source: Transport) -> tuple[Any, ...]:
    """What the bar shows, to repaint only when it changed."""
    return (round(source.position, 1), source.paused, source.at_end, source.speed)
