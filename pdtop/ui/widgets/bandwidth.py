"""Bandwidth: estimated bytes moved per round over round time, against the device's peak."""
from __future__ import annotations

import textwrap

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.telemetry.events import Hw
from pdtop.ui.chart import block_chart
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel
from pdtop.ui.window_figures import bandwidth, bandwidth_series


def _hw_value(value: float | str) -> str:
    return f"{value:.3g}" if isinstance(value, float) else value


class BandwidthPanel(Panel):
    TITLE = "bandwidth (estimated)"
    LINE_API = True
    hint_hidden: str | None = None  # the NVML hint when the panel had no room for it

    def on_mount(self) -> None:
        super().on_mount()
        self.border_subtitle = "bytes moved / round time"

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            self.hint_hidden = None
            return scraped.not_exposed(self, "bytes moved", state.scrape)
        rounds = state.window()
        avg, last = bandwidth(rounds)
        peak = state.info.peak_bytes_per_s
        share = fmt.percent(avg / peak) if peak and avg is not None else "–"
        of_peak = [Text.assemble("  ", (share, "bold"), (" of ", "dim"), fmt.rate_bytes(peak))] if peak else []
        last_part = Text.assemble(("  last ", "dim"), fmt.rate_bytes(last))
        head = Text()
        for parts in ([last_part, *of_peak], of_peak, [Text.assemble("  ", (share, "bold"))] if peak else []):
            head = Text.assemble(("avg ", "dim"), (fmt.rate_bytes(avg), "bold"), *parts)
            if head.cell_len <= self.inner_width:
                break
        hw_lines = hw_text(state.hw, self.inner_width, on_gpu=state.info.device_kind == "cuda")
        if self.inner_height - 1 - len(hw_lines) < 2 and state.hw is not None and state.hw.cpu_percent:
            hw_lines = hw_lines[:-1]  # small: the host line goes first, so the chart keeps a row or two
        self.hint_hidden = None
        if self.inner_height - 1 - len(hw_lines) < 1:  # no room for the NVML hint: the status line says it
            self.hint_hidden = " ".join(line.plain for line in hw_lines)
            hw_lines = [Text("NVML n/a (reason at the top)", "dim")]
        height = max(1, self.inner_height - 1 - len(hw_lines))
        values = bandwidth_series(rounds, state.slices(self.inner_width), self.inner_width)
        top = max([v for v in values if v is not None] + [peak or 0.0, 1.0])
        chart = block_chart(values, height, top, self.colour("chart"), peak, self.colour("slo"), self.colour("idle"))
        return Group(head, *chart, *hw_lines)


def host_line(hw: Hw, width: int) -> Text:
    """`host mem 18%  cpu 12% 40% …`: the memory first, then each core's use while they fit (`…` for the rest)."""
    head = Text.assemble(("host mem ", "dim"), fmt.percent(hw.host_mem_percent / 100), ("  cpu", "dim"))
    cores = [fmt.percent(c / 100) for c in hw.cpu_percent]
    shown = len(cores)
    while shown and head.cell_len + sum(len(c) + 1 for c in cores[:shown]) + (2 if shown < len(cores) else 0) > width:
        shown -= 1
    return head + Text(" " + " ".join(cores[:shown]) + (" …" if shown < len(cores) else ""))


_GPU_FIELDS = (("dram_bw_util_pct", "DRAM bw", "%"), ("mem_busy_pct", "mem busy", "%"),
               ("sm_util_pct", "SM", "%"), ("gpu_util_pct", "util", "%"), ("power_w", "", " W"))
NA = "n/a"


def hw_text(hw: Hw | None, width: int = 80, on_gpu: bool = True) -> list[Text]:
    """The latest `hw` event: NVML figures when the server has them (or, `on_gpu` only, why
    not, wrapped to `width` and never cut), then the host's CPU and memory. On a cpu or simulated
    device NVML has nothing to say, so its absence is not news."""
    lines: list[Text] = []
    if hw is None:
        return lines
    gpu = [(label, value, unit) for key, label, unit in _GPU_FIELDS if (value := getattr(hw, key)) is not None]
    if gpu:  # the server samples NVML
        known = [f"{label} {_hw_value(value)}{unit}".strip() for label, value, unit in gpu if value != NA]
        if known:
            lines.append(Text.assemble(("NVML ", "dim"), "  ".join(known)))
        elif on_gpu:
            reason = f"NVML n/a: {hw.gpu_reason}" if hw.gpu_reason else "NVML n/a"
            lines.extend(Text(line, "dim") for line in textwrap.wrap(reason, max(10, width)))
    if hw.cpu_percent:
        lines.append(host_line(hw, width))
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return lines
