"""The split panel for an SGLang pdmux server (`attach http://... --sglang-log` / `--pdmux-config`): the
level in force as a bar, in the embedded engine's words (`level 3/7`, `prefill 88 SMs`), where it comes
from (the log, or inferred), and the level table with each level's share of the window's time and the
ITL p50 of the reads made there."""
from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.telemetry.events import ScrapedSplit
from pdtop.ui.chart import split_band, split_bar
from pdtop.ui.level_table import LevelRow, level_table
from pdtop.ui.scrape_view import ScrapeView

if TYPE_CHECKING:
    from pdtop.ui.widgets.base import Panel

UNIT = "SMs"


def level_figures(view: ScrapeView, n: int) -> tuple[list[float | None], list[float | None]]:
    """Each level's share of the window's time and ITL p50. The share comes from the log's seconds per
    level (the difference between the window's first and latest read, since the latest start-up), or,
    when the level is inferred, from the reads made at each level."""
    if not view.splits:
        return [None] * n, [None] * n
    latest = view.splits[-1]
    since = latest.time - view.target.window_s
    points = [p for p in view.splits if p.time >= since and p.starts == latest.starts]
    shares: list[float | None] = [None] * n
    if latest.level_time_s and len(latest.level_time_s) == n:
        first = next((p for p in points if len(p.level_time_s) == n), latest)
        spent = [max(0.0, a - (b if first is not latest else 0.0))
                 for a, b in zip(latest.level_time_s, first.level_time_s, strict=True)]
        total = sum(spent)
        if total > 0:
            shares = [s / total for s in spent]
    else:
        counted = [p.level for p in points if p.level is not None and 0 <= p.level < n]
        if counted:
            shares = [counted.count(i) / len(counted) for i in range(n)]
    itls: list[float | None] = []
    for i in range(n):
        at = [p.itl_read_p50_s for p in points if p.level == i and p.itl_read_p50_s is not None]
        itls.append(median(at) if at else None)
    return shares, itls


def _source_line(split: ScrapedSplit, view: ScrapeView) -> Text:
    if split.note:
        return Text(split.note, "bold")
    if split.inferred:
        m = view.latest
        running = fmt.count(m.running if isinstance(m.running, float | int) else None) if m else "–"
        waiting = fmt.count(m.waiting if isinstance(m.waiting, float | int) else None) if m else "–"
        return Text(f"inferred: SGLang's rule for {running} running, {waiting} waiting (--pdmux-config), "
                    "not read from the log", "dim")
    if split.level is None:
        if split.levels:
            return Text("level in force: not in the log yet (SGLang logs it with --log-level debug)", "dim")
        return Text("waiting for SGLang's 'PD-Multiplexing enabled' line", "dim")
    restarted = f" · restarted {split.starts - 1}×" if split.starts > 1 else ""
    return Text(f"from SGLang's log{restarted}", "dim")


def render(panel: Panel, view: ScrapeView, split: ScrapedSplit, width: int, height: int) -> Group:
    prefill, decode, idle = panel.colour("prefill"), panel.colour("decode"), panel.colour("idle")
    panel.border_title, panel.border_subtitle = f"{UNIT} split", ""
    n = len(split.levels)
    level = "–" if split.level is None else str(split.level)
    label = Text("inferred", "bold " + panel.colour("warning")) if split.inferred else \
        Text("log", panel.colour("success")) if split.level is not None else Text("")
    head = Text.assemble(f"level {level}", (f"/{n - 1}" if n else "", "dim"), "  ")
    p, d = split.prefill_units, split.decode_units
    if p is not None and d is not None:
        head.append_text(Text.assemble((f"{p}/{d} {UNIT}", "bold"), "  "))
        bar = split_bar(p, d, width, prefill, decode, idle)
        legend = Text.assemble(("■ ", prefill), f"prefill {fmt.units(p, UNIT)}   ",
                               ("■ ", decode), f"decode {fmt.units(d, UNIT)}")
    else:
        bar, legend = Text("░" * width, idle), Text("")
    head.append_text(label)
    lines = [head, bar, legend, _source_line(split, view)] if height >= 7 else [head, bar, _source_line(split, view)]
    rows = height - len(lines)
    if rows >= 2 and n:
        lines += _table(panel, view, split, width, rows)
    return Group(*lines[:max(1, height)])


def _table(panel: Panel, view: ScrapeView, split: ScrapedSplit, width: int, rows: int) -> list[Text]:
    shares, itls = level_figures(view, len(split.levels))
    table = [LevelRow(i, p, d, shares[i], itls[i], i == split.level) for i, (p, d) in enumerate(split.levels)]
    return level_table(panel, table, width, rows)


LABEL = 8


def timeline(panel: Panel, view: ScrapeView, width: int, height: int) -> Group | None:
    """The timeline for an SGLang server with a split: the level band, one column per read (decode's
    share of the SMs, as for the embedded engine's rounds), and the level number under it; None without
    a split (the panel then says rounds are not exposed)."""
    split = view.latest.split if view.latest is not None else None
    if split is None or not split.levels:
        return None
    cols = max(4, width - LABEL)
    points = list(view.splits)[-cols:]
    n = len(split.levels)
    shares: list[float | None] = []
    for p in points:
        if p.level is None or not 0 <= p.level < n:
            shares.append(None)
            continue
        pre, dec = split.levels[p.level]
        shares.append(dec / (pre + dec) if pre + dec else None)
    pad = " " * (cols - len(points))
    panel.border_title = "timeline · reads"
    how = "inferred" if split.inferred else "from the log"
    panel.border_subtitle = f"the level at each of the last {len(points)} reads ({how}) · newest on the right"
    lines = [Text.assemble((f"{'split':<{LABEL}}", "dim"), pad,
                           split_band(shares, panel.colour("prefill"), panel.colour("decode"), panel.colour("idle")))]
    if height >= 2:
        levels = "".join("·" if p.level is None else str(p.level)[-1] for p in points)
        lines.append(Text.assemble((f"{'level':<{LABEL}}", "dim"), pad, (levels, "dim")))
    if height >= 3:
        lines.append(Text("decode's share of the SMs: a full block is all decode, blank all prefill", "dim"))
    return Group(*lines[:max(1, height)])
