"""Bandwidth: estimated bytes moved per round over round time, against the device's peak."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.telemetry.events import Hw
from pdtop.ui import format as fmt
from pdtop.ui.chart import block_chart
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel


def _hw_value(value: float | str) -> str:
    return f"{value:.3g}" if isinstance(value, float) else value


class BandwidthPanel(Panel):
    TITLE = "bandwidth (estimated)"
    LINE_API = True

    def on_mount(self) -> None:
        super().on_mount()
        self.border_subtitle = "bytes moved / round time"

    def render_state(self, state: DashboardState) -> Group:
        rounds = state.window()
        avg, last = state.bandwidth(rounds)
        peak = state.info.peak_bytes_per_s
        head = Text.assemble(("avg ", "dim"), (fmt.rate_bytes(avg), "bold"), ("  last ", "dim"), fmt.rate_bytes(last))
        if peak:
            share = fmt.percent(avg / peak) if avg is not None else "–"
            head.append_text(Text.assemble("  ", (share, "bold"), (" of ", "dim"), fmt.rate_bytes(peak)))
        hw_lines = hw_text(state.hw)
        height = max(1, self.inner_height - 1 - len(hw_lines))
        values = state.bandwidth_series(self.inner_width, rounds)
        top = max([v for v in values if v is not None] + [peak or 0.0, 1.0])
        chart = block_chart(values, height, top, self.colour("chart"), peak, self.colour("slo"), self.colour("idle"))
        return Group(head, *chart, *hw_lines)


_GPU_FIELDS = (("dram_bw_util_pct", "DRAM bw", "%"), ("mem_busy_pct", "mem busy", "%"),
               ("sm_util_pct", "SM", "%"), ("gpu_util_pct", "util", "%"), ("power_w", "", " W"))
NA = "n/a"


def hw_text(hw: Hw | None) -> list[Text]:
    """The latest `hw` event as up to two lines: NVML figures when the server has them, then the host."""
    lines: list[Text] = []
    if hw is None:
        return lines
    gpu = [(label, value, unit) for key, label, unit in _GPU_FIELDS if (value := getattr(hw, key)) is not None]
    if gpu:  # the server samples NVML
        known = [f"{label} {_hw_value(value)}{unit}".strip() for label, value, unit in gpu if value != NA]
        if known:
            lines.append(Text.assemble(("NVML ", "dim"), "  ".join(known)))
        else:
            reason = hw.gpu_reason or ""
            lines.append(Text.assemble(("NVML n/a", "dim"), (f"  {reason}" if reason else "", "dim")))
    if hw.cpu_percent:
        lines.append(Text.assemble(("host cpu ", "dim"), " ".join(f"{c:.0f}%" for c in hw.cpu_percent[:16]),
                                   ("  mem ", "dim"), f"{hw.host_mem_percent:.0f}%"))
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return lines
