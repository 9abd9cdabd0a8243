"""The level table of the split panels (the embedded engine's, and an SGLang server's from its log or config):
one row per level with its split as a small bar, its share of the window's time and the ITL there, in two
columns where the width allows and the rows need it. Where not every level fits, the current level and
those with the most time are listed, and the last line says how many are not."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text

from pdtop import format as fmt
from pdtop.ui.chart import split_bar

if TYPE_CHECKING:
    from pdtop.ui.widgets.base import Panel

CELL_MIN = 30  # a cell's width without its bar
PRED_W = 8  # the `pred` column (level_rule slo)


@dataclass(frozen=True)
class LevelRow:
    level: int | None  # None: the idle row
    prefill_units: int
    decode_units: int
    share: float | None  # of the window's time (None: unknown)
    itl_p50_s: float | None
    current: bool  # the level in force (or idle, now)
    predicted_s: float | None = None  # level_rule slo: the step its model predicts here


def level_table(panel: Panel, rows: list[LevelRow], width: int, height: int, pred: bool = False) -> list[Text]:
    """The table in at most `height` lines (the first the column names); none under 2. `pred`: with the
    `pred` column."""
    if height < 2 or not rows:
        return []
    columns = 2 if width >= 2 * CELL_MIN + 2 and len(rows) > height - 1 else 1
    capacity = (height - 1) * columns
    listed = rows
    if len(rows) > capacity:  # keep the current level and where the time went; the last line says so
        capacity = (height - 2) * columns
        ranked = sorted(rows, key=lambda r: (not r.current, -(r.share or 0.0)))
        keep = {id(r) for r in ranked[:max(0, capacity)]}
        listed = [r for r in rows if id(r) in keep]
    col_w = width // columns
    pred_w = PRED_W if pred else 0
    mini = max(3, min(16, col_w - CELL_MIN - pred_w))
    cells = [_cell(panel, r, mini, col_w, pred) for r in listed]
    header = Text()
    for _ in range(columns):
        pred_head = f" {'pred':>{PRED_W - 1}}" if pred else ""
        cell = Text(f" lvl  {'':{mini}} {'P/D':>7} {'time':>5} {'ITL p50':>8}{pred_head}", "dim")
        cell.pad_right(max(0, col_w - cell.cell_len))
        header.append_text(cell)
    lines = [header]
    per_column = (len(cells) + columns - 1) // columns
    for i in range(per_column):
        line = Text()
        for c in range(columns):
            if i + c * per_column < len(cells):
                line.append_text(cells[i + c * per_column])
        lines.append(line)
    if len(listed) < len(rows):
        hidden = len(rows) - len(listed)
        note = f"+{hidden} more not listed: the current level and the busiest are"
        lines.append(Text(fmt.fit(note if len(note) <= width else f"+{hidden} more not listed", width), "dim"))
    return lines


def _cell(panel: Panel, row: LevelRow, mini: int, col_w: int, pred: bool) -> Text:
    style = "bold" if row.current else "dim"
    marker = ("▶" if row.current else " ", "bold " + panel.colour("accent") if row.current else "")
    share = fmt.percent(row.share)
    itl = fmt.ms(row.itl_p50_s)
    if row.level is None:
        cell = Text.assemble(marker, (f"{'idle':>4} ", style), " " * mini, (f" {'':>7}", style))
    else:
        p, d = row.prefill_units, row.decode_units
        cell = Text.assemble(marker, (f"{row.level:>3}  ", style),
                             split_bar(p, d, mini, panel.colour("prefill"), panel.colour("decode"),
                                       panel.colour("idle")),
                             (f" {f'{p}/{d}':>7}", style))
    cell.append_text(Text.assemble((f" {share:>5}", "bold" if row.current else ""), f" {itl:>8}"))
    if pred:  # the model's step beside the measured ITL
        cell.append(f" {fmt.ms(row.predicted_s):>{PRED_W - 1}}", "dim")
    cell.pad_right(max(0, col_w - cell.cell_len))
    return cell
