"""The split: the device's units as a bar coloured prefill / decode, the knobs, and a table of
every level with its share of the window's time and the decode batch's ITL there."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop.telemetry.events import EngineConfig
from pdtop.ui import format as fmt
from pdtop.ui.chart import split_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel
from pdtop.ui.window_figures import LevelStat, level_stats

CELL_MIN = 30  # a table cell's width without its bar


class SplitPanel(Panel):
    TITLE = "split"

    def paint_key(self, state: DashboardState) -> object:
        return state.version

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            return scraped.split(self, state.scrape, self.inner_width)
        prefill, decode, idle = self.colour("prefill"), self.colour("decode"), self.colour("idle")
        unit = state.info.unit_name
        self.border_title = f"{unit} split"
        width, height = self.inner_width, self.inner_height
        if not state.hello:  # not connected yet: no device, no levels (not "all 0 units")
            return Group(Text.assemble(("split: ", "dim"), ("nothing known yet", "bold")),
                         Text("the device and its levels come with the engine's first message", "dim"))
        n = len(state.levels)
        level = "–" if state.level is None else str(state.level)
        mode = Text("pinned", "bold " + self.colour("warning")) if state.pinned else \
            Text("auto", self.colour("success"))
        head = Text.assemble(f"level {level}", (f"/{n - 1}" if n else "", "dim"), "  ", mode)
        together = state.prefill_units == state.decode_units == state.info.units  # chunked: one forward
        if state.idle:
            bar = Text("░" * width, idle)
            legend = Text.assemble(("idle", "bold"), (": no request running or waiting", "dim"))
        elif together:
            bar = split_bar(1, 1, width, prefill, decode, idle)
            legend = Text.assemble(("■ ", prefill), ("■ ", decode),
                                   f"prefill and decode in one step on all {fmt.units(state.info.units, unit)}")
        else:
            bar = split_bar(state.prefill_units, state.decode_units, width, prefill, decode, idle)
            legend = Text.assemble(("■ ", prefill), f"prefill {fmt.units(state.prefill_units, unit)}   ",
                                   ("■ ", decode), f"decode {fmt.units(state.decode_units, unit)}")
        knob_line = knobs(state.config, self.colour("warning"))
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
            head = Text.assemble(f"level {level}  ", mode, "  ", short)
            if head.cell_len > width and not state.idle and not together:  # the unit is in the title
                head = Text.assemble(f"level {level} ", mode, " ", ("■ ", prefill), f"prefill {state.prefill_units} ",
                                     ("■ ", decode), f"decode {state.decode_units}")
            lines = [head, bar]
            self.border_subtitle = knob_line.plain.strip()
        lines += self._table(state, width, max(0, height - len(lines)))
        if not state.levels:
            lines.append(Text("waiting for the engine…", "dim"))
        return Group(*lines)

    def _table(self, state: DashboardState, width: int, rows: int) -> list[Text]:
        """The level table in `rows` lines (one of them the column names), in one or two columns."""
        if rows < 2 or not state.levels:
            return []
        stats = {s.level: s for s in level_stats(state.window())}
        entries: list[tuple[int | None, int, int]] = [(i, p, d) for i, (p, d) in enumerate(state.levels)]
        if None in stats:
            entries.append((None, stats[None].prefill_units, stats[None].decode_units))
        columns = 2 if width >= 2 * CELL_MIN + 2 and len(entries) > rows - 1 else 1
        capacity = (rows - 1) * columns
        if len(entries) > capacity:  # keep the current level and where the time went
            ranked = sorted(entries, key=lambda e: (e[0] != state.level, -(stats[e[0]].share if e[0] in stats else 0)))
            keep = {e[0] for e in ranked[:capacity]}
            entries = [e for e in entries if e[0] in keep]
        col_w = width // columns
        mini = max(3, min(16, col_w - CELL_MIN))
        cells = [self._cell(e, stats.get(e[0]), state, mini, col_w) for e in entries]
        header = Text()
        for _ in range(columns):
            cell = Text(f" lvl  {'':{mini}} {'P/D':>7} {'time':>5} {'ITL p50':>8}", "dim")
            cell.pad_right(max(0, col_w - cell.cell_len))
            header.append_text(cell)
        lines = [header]
        per_column = (len(cells) + columns - 1) // columns
        for r in range(per_column):
            row = Text()
            for c in range(columns):
                if r + c * per_column < len(cells):
                    row.append_text(cells[r + c * per_column])
            lines.append(row)
        return lines

    def _cell(self, entry: tuple[int | None, int, int], stat: LevelStat | None, state: DashboardState, mini: int,
              col_w: int) -> Text:
        level, p, d = entry
        current = level == state.level and not state.idle if level is not None else state.idle
        style = "bold" if current else "dim"
        marker = ("▶" if current else " ", "bold " + self.colour("accent") if current else "")
        share = fmt.percent(stat.share) if stat is not None else "–"
        itl = fmt.ms(stat.itl_p50_s) if stat is not None else "–"
        if level is None:
            cell = Text.assemble(marker, (f"{'idle':>4} ", style), " " * mini, (f" {'':>7}", style))
        else:
            cell = Text.assemble(marker, (f"{level:>3}  ", style),
                                 split_bar(p, d, mini, self.colour("prefill"), self.colour("decode"),
                                           self.colour("idle")),
                                 (f" {f'{p}/{d}':>7}", style))
        cell.append_text(Text.assemble((f" {share:>5}", "bold" if current else ""), f" {itl:>8}"))
        cell.pad_right(max(0, col_w - cell.cell_len))
        return cell


def knobs(config: EngineConfig | None, warning: str) -> Text:
    """The knobs of the policy in force, as one line (pdmux: divisor and budget; chunked: chunk size),
    the workload's rate and the manual divisions."""
    text = Text()
    if config is None:
        return text
    knob_values = {"pdmux": (("divisor", str(config.decode_bs_divisor)),
                             ("budget", str(config.split_forward_token_budget))),
                   "chunked": (("chunk", str(config.chunk_size)),)}.get(config.policy, ())
    for label, shown in (*knob_values, ("rate", f"{config.workload_rate:g}/s")):
        text.append_text(Text.assemble((f"{label} ", "dim"), shown, "  "))
    if config.workload_paused:
        text.append("workload paused  ", "bold " + warning)
    if config.manual_divisions:
        text.append_text(Text.assemble(("manual ", "dim"),
                                       " ".join(f"{p}/{d}@{t}" for p, d, t in config.manual_divisions)))
    return text
