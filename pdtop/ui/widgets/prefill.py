"""Prefill progress: each in-flight prefill with layers done / total, tokens and ETA."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.ui.chart import fill_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel


def _ids(ids: list[int]) -> str:
    if len(ids) <= 3:
        return ",".join(str(i) for i in ids)
    return f"{ids[0]},{ids[1]}…+{len(ids) - 2}"


MAX_ROWS = 6


class PrefillPanel(Panel):
    TITLE = "prefill in flight"

    def paint_key(self, state: DashboardState) -> object:
        return state.scrape is not None, tuple((tuple(p.request_ids), p.layers_done, p.layers_total, p.tokens_done,
                                                p.eta_s and round(p.eta_s, 2)) for p in state.prefills)

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            return scraped.not_exposed(self, "prefill progress", state.scrape)
        self.border_title = f"prefill in flight · {len(state.prefills)}"
        if not state.prefills:
            return Group(Text("no prefill in flight", "dim"))
        width = self.inner_width
        wide = width >= 70
        screen_h = self.app.size.height  # the panel's height follows its lines: its room follows the screen's
        rows = MAX_ROWS if screen_h >= 40 else 2 if screen_h >= 28 else 1
        shown = state.prefills if len(state.prefills) <= rows else state.prefills[:rows - 1]
        lines: list[Text] = []
        for p in shown:
            left = Text.assemble((f"req {_ids(p.request_ids):<9}", "bold"), f"{fmt.count(p.tokens):>6} tok ")
            if p.tokens_done is not None:  # chunked: a chunk of tokens through every layer per round
                frac = p.tokens_done / p.tokens if p.tokens else None
                right = Text.assemble(f" {fmt.count(p.tokens_done):>6}", (" tok ", "dim"),
                                      ("chunked " if wide else "", "dim"), ("ETA ", "dim"),
                                      f"{fmt.duration(p.eta_s):>8}")
            else:
                frac = p.layers_done / p.layers_total if p.layers_total else None
                k = f"{p.layers_per_round}/rnd" if p.layers_per_round else "1 step"
                right = Text.assemble(f" {p.layers_done:>3}/{p.layers_total:<3}", (" layers " if wide else " ", "dim"),
                                      (f"{k:<8}", "dim") if wide else "", ("ETA ", "dim"),
                                      f"{fmt.duration(p.eta_s):>8}")
            bar_w = max(4, width - left.cell_len - right.cell_len)
            lines.append(Text.assemble(left, fill_bar(frac, bar_w, self.colour("prefill"), self.colour("idle")),
                                       right))
        if len(shown) < len(state.prefills):
            lines.append(Text(f"… {len(state.prefills) - len(shown)} more", "dim"))
        return Group(*lines)
