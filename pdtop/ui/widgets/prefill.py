"""Prefill progress: each in-flight prefill with layers done / total, tokens and ETA."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.ui import format as fmt
from pdtop.ui.chart import fill_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


def _ids(ids: list[int]) -> str:
    if len(ids) <= 3:
        return ",".join(str(i) for i in ids)
    return f"{ids[0]},{ids[1]}…+{len(ids) - 2}"


MAX_ROWS = 6


class PrefillPanel(Panel):
    TITLE = "prefill in flight"

    def paint_key(self, state: DashboardState) -> object:
        return tuple((tuple(p.request_ids), p.layers_done, p.layers_total, p.eta_s and round(p.eta_s, 2))
                     for p in state.prefills)

    def render_state(self, state: DashboardState) -> Group:
        self.border_title = f"prefill in flight · {len(state.prefills)}"
        if not state.prefills:
            return Group(Text("no prefill in flight", "dim"))
        width = self.inner_width
        bar_w = max(6, width - 66)
        lines: list[Text] = []
        for p in state.prefills[:MAX_ROWS]:
            frac = p.layers_done / p.layers_total if p.layers_total else None
            k = f"{p.layers_per_round}/rnd" if p.layers_per_round else "chunked"
            lines.append(Text.assemble(
                (f"req {_ids(p.request_ids):<9}", "bold"),
                f"{fmt.count(p.tokens):>6} tok ",
                fill_bar(frac, bar_w, self.colour("prefill"), self.colour("idle")),
                f" {p.layers_done:>3}/{p.layers_total:<3} layers ",
                (f"{k:<8}", "dim"),
                ("ETA ", "dim"), f"{fmt.duration(p.eta_s):>8}",
            ))
        if len(state.prefills) > MAX_ROWS:
            lines.append(Text(f"… {len(state.prefills) - MAX_ROWS} more", "dim"))
        return Group(*lines)
