"""ITL: per-round decode step time over a rolling window, with p50/p99/max and the SLO line."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.ui import format as fmt
from pdtop.ui.chart import block_chart
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel

AXIS = 9  # width of the y-axis labels


class ItlPanel(Panel):
    TITLE = "ITL · decode step per round"
    LINE_API = True

    def render_state(self, state: DashboardState) -> Group:
        rounds = state.window()
        p50, p99, worst = state.itl_summary(rounds)
        slo = state.itl_slo_s
        over = sum(1 for r in rounds if r.decode_bs > 0 and slo is not None and r.decode_step_s > slo)
        decoded = sum(1 for r in rounds if r.decode_bs > 0)
        head = Text.assemble(("p50 ", "dim"), fmt.ms(p50), ("  p99 ", "dim"), fmt.ms(p99),
                             ("  max ", "dim"), fmt.ms(worst))
        if slo is not None:
            share = f"  {fmt.percent(over / decoded)} over" if decoded else ""
            head.append_text(Text.assemble(("  SLO ", "dim"), (fmt.ms(slo), self.colour("slo")), share))
        else:
            head.append("  SLO – (s)", "dim")
        self.border_subtitle = f"worst step per slice · last {fmt.duration(state.window_s)}"
        width = max(4, self.inner_width - AXIS)
        height = max(2, self.inner_height - 1)
        values = state.itl_series(width, rounds)
        top = max([v for v in values if v is not None] + [slo * 1.25 if slo else 0.0, 1e-3])
        rows = block_chart(values, height, top, self.colour("chart"), slo, self.colour("slo"), self.colour("idle"))
        lines = [head]
        for i, row in enumerate(rows):
            if i == 0:
                label = fmt.ms(top)
            elif i == height - 1:
                label = "0"
            else:
                label = ""
            lines.append(Text.assemble((f"{label:>{AXIS - 1}} ", "dim"), row))
        return Group(*lines)
