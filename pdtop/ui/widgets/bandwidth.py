"""Bandwidth: estimated bytes moved per round over round time, against the device's peak."""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from pdtop.ui import format as fmt
from pdtop.ui.chart import block_chart
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


def _hw_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


class BandwidthPanel(Panel):
    TITLE = "bandwidth (estimated)"

    def render_state(self, state: DashboardState) -> Group:
        rounds = state.window()
        avg, last = state.bandwidth(rounds)
        peak = state.info.peak_bytes_per_s
        head = Text.assemble(("avg ", "dim"), (fmt.rate_bytes(avg), "bold"), ("  last ", "dim"), fmt.rate_bytes(last))
        if peak:
            share = f" ({fmt.percent(avg / peak)} of peak)" if avg is not None else ""
            head.append_text(Text.assemble(("  peak ", "dim"), fmt.rate_bytes(peak), share))
        hw = {k: v for k, v in state.hw.items() if k != "time"}
        rows_for_hw = 1 if hw else 0
        height = max(1, self.inner_height - 1 - rows_for_hw)
        values = state.bandwidth_series(self.inner_width, rounds)
        top = max([v for v in values if v is not None] + [peak or 0.0, 1.0])
        chart = block_chart(values, height, top, self.colour("chart"), peak, self.colour("slo"), self.colour("idle"))
        lines = [head, *chart]
        if hw:
            lines.append(Text.assemble(("hw ", "dim"), "  ".join(f"{k} {_hw_value(v)}" for k, v in hw.items())))
        return Group(*lines)
