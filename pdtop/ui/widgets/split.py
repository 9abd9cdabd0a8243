"""SM split: the device's units as a bar coloured prefill / decode, and every level."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.ui.chart import split_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


class SplitPanel(Panel):
    TITLE = "split"

    def render_state(self, state: DashboardState) -> Group:
        prefill, decode = self.colour("prefill"), self.colour("decode")
        idle, muted = self.colour("idle"), "dim"
        unit = state.info.unit_name
        self.border_title = f"{unit} split"
        width = self.inner_width
        mode = Text("pinned", "bold " + self.colour("warning")) if state.pinned else Text("auto", self.colour("success"))
        n = len(state.levels)
        level = "–" if state.level is None else str(state.level)
        head = Text.assemble(f"level {level}", (f"/{n - 1}" if n else "", muted), "  ", mode,
                             ("  policy ", muted), state.policy)
        bar = split_bar(state.prefill_units, state.decode_units, width, prefill, decode, idle)
        legend = Text.assemble(("■ ", prefill), f"prefill {state.prefill_units} {unit}   ",
                               ("■ ", decode), f"decode {state.decode_units} {unit}")
        lines: list[Text] = [head, bar, legend]
        mini = max(4, min(24, width - 22))
        for i, (p, d) in enumerate(state.levels):
            current = i == state.level
            marker = ("▶ " if current else "  ", "bold " + self.colour("accent") if current else "")
            row = Text.assemble(marker, (f"{i:>2} ", "bold" if current else muted),
                                split_bar(p, d, mini, prefill, decode, idle),
                                (f" {p:>4}/{d:<4}", "bold" if current else muted))
            lines.append(row)
        if not state.levels:
            lines.append(Text("waiting for the engine…", muted))
        return Group(*lines)
