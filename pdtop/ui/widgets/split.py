"""The split: the device's units as a bar coloured prefill / decode, the knobs, and a table of
every level with its share of the window's time and the decode batch's ITL there."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.engine.description import EngineConfig
from pdtop.ui.chart import split_bar
from pdtop.ui.level_table import LevelRow, level_table
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel
from pdtop.ui.widgets.pools import pool_lines
from pdtop.ui.window_figures import level_rows


class SplitPanel(Panel):
    TITLE = "split"

    def paint_key(self, state: DashboardState) -> object:
        return state.version

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            return scraped.split(self, state.scrape, self.inner_width)
        if state.policy == "disagg" and state.disagg is not None:
            self.border_title, self.border_subtitle = "disagg · two instances, two KV pools", knobs(
                state.config, self.colour("warning")).plain.strip()
            return Group(*pool_lines(self, state, state.disagg, self.inner_width, self.inner_height))
        prefill, decode, idle = self.colour("prefill"), self.colour("decode"), self.colour("idle")
        unit = state.info.unit_name
        self.border_title = f"{unit} split"
        width, height = self.inner_width, self.inner_height
        if not state.hello:  # not connected yet: no device, no levels (not "all 0 units")
            return Group(Text.assemble(("split: ", "dim"), ("nothing known yet", "bold")),
                         Text("the device and its levels come with the engine's first message"
                              if width >= 62 else "levels come with the first message", "dim"))
        n = len(state.levels)
        level = "–" if state.level is None else str(state.level)
        mode = Text("pinned", "bold " + self.colour("warning")) if state.pinned else \
            Text("auto", self.colour("success"))
        split_on = state.policy in ("pdmux", "?")  # chunked and prefill-first run no split level
        other = state.info.server.split(" ")[0]  # pdtop inside another engine: "SGLang"
        if not split_on:
            mode = Text(f"{other}, no pdmux" if other else state.policy, "bold")
        head = Text.assemble(f"level {level}", (f"/{n - 1}" if n else "", "dim"), "  ", mode) if split_on else \
            Text.assemble(mode, ("  no split level: one forward at a time", "dim"))
        together = state.prefill_units == state.decode_units == state.info.units  # chunked: one forward
        overlapped = not together and state.prefill_units + state.decode_units > state.info.units  # SGLang's
        # overlap_decode_full_sm: decode on the whole device beside the capped prefill
        if state.idle:
            bar = Text("░" * width, idle)
            legend = Text.assemble(("idle", "bold"), (": no request running or waiting", "dim"))
        elif together:
            bar = split_bar(1, 1, width, prefill, decode, idle)
            legend = Text.assemble(("■ ", prefill), ("■ ", decode),
                                   f"prefill and decode in one step on all {fmt.units(state.info.units, unit)}")
        elif overlapped:
            bar = split_bar(state.prefill_units, state.info.units - state.prefill_units, width, prefill, decode, idle)
            legend = Text.assemble(("■ ", prefill), f"prefill {fmt.units(state.prefill_units, unit)}   ",
                                   ("■ ", decode), f"decode all {fmt.units(state.decode_units, unit)}, overlapping")
        else:
            bar = split_bar(state.prefill_units, state.decode_units, width, prefill, decode, idle)
            legend = Text.assemble(("■ ", prefill), f"prefill {fmt.units(state.prefill_units, unit)}   ",
                                   ("■ ", decode), f"decode {fmt.units(state.decode_units, unit)}")
        predicted = state.predicted_steps_s
        now = predicted[state.level] if predicted and state.level is not None and state.level < len(predicted) else None
        knob_line = knobs(state.config, self.colour("warning"), now, workload=not other)
        if height >= 9 or (height >= 7 and n <= 3):
            lines = [head, bar, legend, knob_line]
            self.border_subtitle = ""
        else:  # short: the legend joins the head, the knobs go to the border
            if state.idle:
                short = Text.assemble(("idle", "bold"), (": no requests", "dim"))
            elif together:
                short = Text.assemble(("■ ", prefill), ("■ ", decode), f"one step, all {unit}")
            else:
                short = Text.assemble(("■ ", prefill), f"prefill {state.prefill_units}  ", ("■ ", decode),
                                      f"decode {fmt.units(state.decode_units, unit)}")
            head = Text.assemble(f"level {level}  " if split_on else "", mode, "  ", short)
            if head.cell_len > width and not state.idle and not together and split_on:  # the unit is in the title
                head = Text.assemble(f"level {level} ", mode, " ", ("■ ", prefill), f"prefill {state.prefill_units} ",
                                     ("■ ", decode), f"decode {state.decode_units}")
            lines = [head, bar]
            self.border_subtitle = knob_line.plain.strip()
        if split_on:
            lines += self._table(state, width, max(0, height - len(lines)))
        elif height > len(lines) and other:
            note = f"{other} splits the {unit} only when started with --enable-pdmux"
            lines.append(Text(note if len(note) <= width else "split: needs --enable-pdmux", "dim"))
        elif height > len(lines):
            note = f"the {n} split levels apply under pdmux (p: policy)"
            lines.append(Text(note if len(note) <= width else "split levels: under pdmux (p)", "dim"))
        if not state.levels:
            lines.append(Text("waiting for the engine…", "dim"))
        return Group(*lines)

    def _table(self, state: DashboardState, width: int, rows: int) -> list[Text]:
        """The level table in `rows` lines: every level in force with its figures over the window, and idle."""
        predicted = state.predicted_steps_s
        table = []
        for level, p, d, stat in level_rows(state.levels, state.window(), state.levels_since):
            current = level == state.level and not state.idle if level is not None else state.idle
            pred = predicted[level] if predicted is not None and level is not None and level < len(predicted) else None
            table.append(LevelRow(level, p, d, stat.share if stat is not None else None,
                                  stat.itl_p50_s if stat is not None else None, current, pred))
        return level_table(self, table, width, rows, pred=predicted is not None)


def knobs(config: EngineConfig | None, warning: str, predicted_step_s: float | None = None,
          workload: bool = True) -> Text:
    """The knobs of the policy in force, as one line (pdmux: the level rule when it is `slo`, with
    its SLO and the decode step its model predicts for this split; divisor and budget; chunked:
    chunk size when there is one), the workload's rate (not for another engine's scheduler: its
    requests come from its clients) and the manual divisions."""
    text = Text()
    if config is None:
        return text
    if config.policy == "pdmux" and config.level_rule == "slo" and config.slo_itl_ms is not None:
        pred = "" if predicted_step_s is None else f" pred {fmt.ms(predicted_step_s)}"
        text.append_text(Text.assemble(("rule ", "dim"), f"slo<={config.slo_itl_ms:g} ms{pred}", "  "))
    knob_values = {"pdmux": (("divisor", str(config.decode_bs_divisor)),
                             ("budget", str(config.split_forward_token_budget))),
                   "chunked": (("chunk", str(config.chunk_size)),) if config.chunk_size else ()}.get(config.policy, ())
    rate = (("rate", f"{config.workload_rate:g}/s"),) if workload else ()
    for label, shown in (*knob_values, *rate):
        text.append_text(Text.assemble((f"{label} ", "dim"), shown, "  "))
    if config.workload_paused and workload:
        text.append("workload paused  ", "bold " + warning)
    if config.policy == "pdmux" and config.max_split_forward_layers:
        text.append_text(Text.assemble(("max layers ", "dim"), str(config.max_split_forward_layers), "  "))
    if config.manual_divisions:
        text.append_text(Text.assemble(("manual ", "dim"),
                                       " ".join(f"{p}/{d}@{t}" for p, d, t in config.manual_divisions)))
    if config.overlap_decode_full_sm:
        text.append(" overlap", "dim")
    return text
