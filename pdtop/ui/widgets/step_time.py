"""Decode step time: per-round decode step time over a rolling window, with p50/p99/max, the
ITL SLO line and marks where the configuration changed (one letter per setting, on the last row)."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.ui.chart import block_chart
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel
from pdtop.ui.window_figures import step_series, step_summary
from pdtop.ui.words import MARK_WORDS, change_mark, change_words

WARMUP_ROUNDS = 8  # an engine's first rounds: warm-up, kept out of the chart's scale


class StepTimePanel(Panel):
    TITLE = "decode step time"
    LINE_API = True

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            return scraped.latency_chart(self, state.scrape, state.itl_slo_s, self.inner_width, self.inner_height)
        rounds = state.window()
        p50, p99, worst = step_summary(rounds)
        slo = state.itl_slo_s
        over = sum(1 for r in rounds if r.decode_bs > 0 and slo is not None and r.decode_step_s > slo)
        decoded = sum(1 for r in rounds if r.decode_bs > 0)
        top_parts = [Text.assemble(("p50 ", "dim"), fmt.ms(p50)), Text.assemble(("  p99 ", "dim"), fmt.ms(p99)),
                     Text.assemble(("  max ", "dim"), fmt.ms(worst))]
        if slo is not None:
            top_parts.append(Text.assemble(("  SLO ", "dim"), (fmt.ms(slo), self.colour("slo"))))
            if decoded:
                top_parts.append(Text(f"  {fmt.percent(over / decoded)} over"))
        else:
            top_parts.append(Text("  SLO none (s sets one)", "dim"))
        head = Text().join(top_parts)
        for drop in (2, -1):  # narrow: max goes first, then the last part
            if head.cell_len <= self.inner_width or len(top_parts) <= 2:
                break
            top_parts.pop(drop)
            head = Text().join(top_parts)
        axis = 9 if self.inner_width >= 60 else 8  # "19.5 ms" and a space
        width = max(4, self.inner_width - axis)
        lines: list[Text] = []
        window = f"last {fmt.duration(state.window_s)}"
        if self.inner_height >= 6:
            lines.append(head)
            self.border_title = self.TITLE
            self.border_subtitle = f"worst step per slice · {window}"
        else:  # short: the chart keeps its rows, the figures go in the border
            self.border_title = f"decode step p50 {fmt.ms(p50)}  p99 {fmt.ms(p99)}"
            over_text = f"{fmt.percent(over / decoded)} over SLO · " if slo is not None and decoded else ""
            self.border_subtitle = over_text + window
        height = max(1, self.inner_height - len(lines) - 1)
        values = step_series(rounds, state.slices(width), width)
        # the engine's first rounds (kernels compiling, caches filling) do not set the scale: drawn clipped
        settled = step_series([r for r in rounds if r.index >= WARMUP_ROUNDS], state.slices(width), width)
        scale = [v for v in settled if v is not None] or [v for v in values if v is not None]
        top = max([*scale, slo * 1.25 if slo else 0.0, 0.001])
        rows = block_chart(values, height, top, self.colour("chart"), slo, self.colour("slo"), self.colour("idle"))
        for i, row in enumerate(rows):
            label = fmt.ms(top) if i == 0 and (scale or slo) else ""  # nothing drawn: no scale to label
            lines.append(Text.assemble((f"{label:>{axis - 1}} ", "dim"), row))
        lines.append(self._marks(state, rounds, width, axis))
        return Group(*lines)

    def _marks(self, state: DashboardState, rounds: list, width: int, axis: int) -> Text:
        """The bottom row: 0 on the axis, a letter under the slice where each config change happened,
        and the latest change in words where there is room right of the marks or left of them (changes
        just made sit at the right edge), else the letters shown named in a word each, else the latest one's."""
        start, end = state.slices(width)
        cells = [" "] * width
        latest = None
        for change in state.config_changes:
            if start <= change.time < end:
                cells[min(width - 1, int((change.time - start) / (end - start) * width))] = change_mark(change.changes)
                latest = change
        styles: list[str | None] = ["bold " + self.colour("accent") if c != " " else None for c in cells]
        if latest is not None:
            at = [i for i, c in enumerate(cells) if c != " "]
            room_right, room_left = width - at[-1] - 1, at[0]
            marks = dict.fromkeys(cells[i] for i in at)  # in order, once each
            last = change_mark(latest.changes)
            for note in (f" {last}: {change_words(latest.changes, state)} ",
                         " " + "  ".join(f"{m}: {MARK_WORDS.get(m, '')}" for m in marks) + " ",  # a legend
                         f" {last}: {MARK_WORDS.get(last, '')} "):  # the latest mark's word alone
                where = width - len(note) if room_right > len(note) + 2 else 0 if room_left > len(note) else None
                if where is not None:
                    cells[where:where + len(note)] = note
                    styles[where:where + len(note)] = ["dim"] * len(note)
                    break
        row = Text.assemble((f"{'0':>{axis - 1}} ", "dim"))
        for style, run in _runs(cells, styles):
            row.append(run, style)
        return row


def _runs(cells: list[str], styles: list[str | None]) -> list[tuple[str | None, str]]:
    """The row's characters grouped by style: few spans, cheap to render."""
    out: list[tuple[str | None, str]] = []
    for c, style in zip(cells, styles, strict=True):
        if out and out[-1][0] == style:
            out[-1] = (style, out[-1][1] + c)
        else:
            out.append((style, c))
    return out
