"""SM split: the device's units as a bar coloured prefill / decode, and every level."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.telemetry.events import EngineConfig
from pdtop.ui.chart import split_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


class SplitPanel(Panel):
    TITLE = "split"

    def paint_key(self, state: DashboardState) -> object:
        return (state.level, state.pinned, state.prefill_units, state.decode_units, tuple(state.levels),
                state.policy, state.info.unit_name, state.config)

    def render_state(self, state: DashboardState) -> Group:
        prefill, decode = self.colour("prefill"), self.colour("decode")
        idle, muted = self.colour("idle"), "dim"
        unit = state.info.unit_name
        self.border_title = f"{unit} split"
        width = self.inner_width
        pinned = Text("pinned", "bold " + self.colour("warning"))
        mode = pinned if state.pinned else Text("auto", self.colour("success"))
        n = len(state.levels)
        level = "–" if state.level is None else str(state.level)
        head = Text.assemble(f"level {level}", (f"/{n - 1}" if n else "", muted), "  ", mode,
                             ("  policy ", muted), state.policy)
        bar = split_bar(state.prefill_units, state.decode_units, width, prefill, decode, idle)
        legend = Text.assemble(("■ ", prefill), f"prefill {state.prefill_units} {unit}   ",
                               ("■ ", decode), f"decode {state.decode_units} {unit}")
        lines: list[Text] = [head, bar, legend, knobs(state.config, self.colour("warning"))]
        levels = state.levels
        columns = 2 if width >= 56 and len(levels) > 3 else 1
        col_w = width // columns
        mini = max(4, min(24, col_w - 16))
        cells = []
        for i, (p, d) in enumerate(levels):
            current = i == state.level
            marker = ("▶" if current else " ", "bold " + self.colour("accent") if current else "")
            cell = Text.assemble(marker, (f"{i:>2} ", "bold" if current else muted),
                                 split_bar(p, d, mini, prefill, decode, idle),
                                 (f" {p:>3}/{d:<3}", "bold" if current else muted))
            cell.pad_right(max(0, col_w - cell.cell_len))
            cells.append(cell)
        rows = (len(cells) + columns - 1) // columns
        for r in range(rows):
            row = Text()
            for c in range(columns):
                if r + c * rows < len(cells):
                    row.append_text(cells[r + c * rows])
            lines.append(row)
        if not levels:
            lines.append(Text("waiting for the engine…", muted))
        return Group(*lines)


def knobs(config: EngineConfig | None, warning: str) -> Text:
    """The knobs an operator changes, as one line: divisor, budget, chunk, rate, manual divisions."""
    text = Text()
    if config is None:
        return text
    for label, shown in (("divisor", str(config.decode_bs_divisor)), ("budget", str(config.split_forward_token_budget)),
                         ("chunk", str(config.chunk_size)), ("rate", f"{config.workload_rate:g}/s")):
        text.append_text(Text.assemble((f"{label} ", "dim"), shown, "  "))
    if config.workload_paused:
        text.append("workload paused  ", "bold " + warning)
    if config.manual_divisions:
        text.append_text(Text.assemble(("manual ", "dim"),
                                       " ".join(f"{p}/{d}@{t}" for p, d, t in config.manual_divisions)))
    return text
