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


def hw_text(hw: dict[str, Any]) -> list[Text]:
    """The latest `hw` event as up to two lines: NVML figures when the server has them, then the host."""
    lines: list[Text] = []
    gpu = {key: hw[key] for key, _label, _unit in _GPU_FIELDS if key in hw}
    if gpu:
        known = [f"{label} {_hw_value(gpu[key])}{unit}".strip() for key, label, unit in _GPU_FIELDS
                 if key in gpu and gpu[key] != NA]
        if known:
            lines.append(Text.assemble(("NVML ", "dim"), "  ".join(known)))
        else:
            reason = str(hw.get("gpu_reason") or "")
            lines.append(Text.assemble(("NVML n/a", "dim"), (f"  {reason}" if reason else "", "dim")))
    cpu = hw.get("cpu_percent")
    if isinstance(cpu, list) and cpu:
        host = Text.assemble(("host cpu ", "dim"), " ".join(f"{c:.0f}%" for c in cpu[:16]))
        mem = hw.get("host_mem_percent", hw.get("mem_percent"))
        if isinstance(mem, (int, float)):
            host.append_text(Text.assemble(("  mem ", "dim"), f"{mem:.0f}%"))
        lines.append(host)
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return lines
