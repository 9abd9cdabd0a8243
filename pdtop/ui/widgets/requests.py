"""Requests: running / waiting, KV usage, TTFT p50/p99 and output tokens/s."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.ui import format as fmt
from pdtop.ui.chart import fill_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


class RequestsPanel(Panel):
    TITLE = "requests"

    def render_state(self, state: DashboardState) -> Group:
        ttft50, ttft99 = state.ttft_summary()
        itl50, itl99, _ = state.pooled_itl_summary()
        kv = state.kv_usage
        bar_w = max(6, self.inner_width - 30)
        kv_colour = self.colour("error") if kv is not None and kv > 0.9 else self.colour("decode")
        return Group(
            Text.assemble(("running ", "dim"), (f"{state.running:<5}", "bold"), ("waiting ", "dim"),
                          (f"{state.waiting:<5}", "bold"), ("decode bs ", "dim"), str(state.decode_bs)),
            Text.assemble(("KV ", "dim"), fill_bar(kv, bar_w, kv_colour, self.colour("idle")),
                          f" {fmt.percent(kv)} ",
                          (f"{fmt.count(state.kv_used)}/{fmt.count(state.kv_capacity)} tok", "dim")),
            Text.assemble(("TTFT ", "dim"), ("p50 ", "dim"), fmt.duration(ttft50), ("  p99 ", "dim"),
                          fmt.duration(ttft99)),
            Text.assemble(("ITL  ", "dim"), ("p50 ", "dim"), fmt.ms(itl50), ("  p99 ", "dim"), fmt.ms(itl99),
                          ("  token gaps", "dim")),
            Text.assemble(("output ", "dim"), (f"{fmt.count(state.tokens_per_s())} tok/s", "bold")),
            Text.assemble(("arrived ", "dim"), fmt.count(state.arrivals), ("  first token ", "dim"),
                          fmt.count(state.first_tokens), ("  finished ", "dim"), fmt.count(state.finished)),
        )
