"""Block charts and bars as Rich Text, sized to a panel.

Pure functions of numbers and colours, so they are easy to test and cheap to call
on every repaint.
"""
from __future__ import annotations

from collections.abc import Collection
from itertools import groupby

from rich.text import Text

EIGHTHS = " ▁▂▃▄▅▆▇█"


def block_chart(
    values: list[float | None],
    height: int,
    top: float,
    colour: str,
    line: float | None = None,
    line_colour: str = "red",
    grid_colour: str = "grey30",
) -> list[Text]:
    """Columns of eighth blocks, one per value, `height` rows tall, scaled so `top` fills it.

    `line` (e.g. an SLO) is drawn as a dashed row at its height, and the parts of the
    columns above it are drawn in `line_colour`. Missing values (None) are blank columns.
    Returns the rows top first.
    """
    height = max(1, height)
    cells = height * 8
    top = top if top > 0 else 1.0
    line_row = None
    if line is not None and 0 < line <= top:
        line_row = min(height - 1, int(line / top * height))  # row index from the bottom
    filled = []
    for value in values:
        f = 0 if value is None else max(0, min(cells, round(value / top * cells)))
        filled.append(1 if f == 0 and value is not None and value > 0 else f)  # non-zero stays visible
    rows: list[Text] = []
    for r in range(height - 1, -1, -1):  # top row first; r counts from the bottom
        base = r * 8
        chars = "".join("█" if f >= base + 8 else (EIGHTHS[f - base] if f > base else " ") for f in filled)
        style = line_colour if line_row is not None and r > line_row else colour
        if r == line_row:
            chars = chars.replace(" ", "╌")
            rows.append(merge_cells([(c, line_colour if c == "╌" else style) for c in chars]))
        else:
            rows.append(_blocks(chars, style))
    return rows


def _blocks(chars: str, style: str) -> Text:
    """A row of blocks in one style, with the gaps left unstyled (few spans: cheap to render)."""
    text = Text()
    for is_gap, run in groupby(chars, key=lambda c: c == " "):
        text.append("".join(run), None if is_gap else style)
    return text


def merge_cells(cells: list[tuple[str, str]]) -> Text:
    """One Text with a span per run of equal style (cheaper to render than a span per cell)."""
    text = Text()
    run: list[str] = []
    style = None
    for char, s in cells:
        if s != style and run:
            text.append("".join(run), style or None)
            run = []
        style = s
        run.append(char)
    if run:
        text.append("".join(run), style or None)
    return text


def split_bar(prefill: int, decode: int, width: int, prefill_colour: str, decode_colour: str,
              idle_colour: str = "grey30") -> Text:
    """A bar of `width` cells: prefill's share on the left, decode's on the right."""
    total = prefill + decode
    text = Text()
    if width <= 0:
        return text
    if total <= 0:
        return text.append("░" * width, idle_colour)
    p_cells = round(prefill / total * width)
    if prefill > 0 and p_cells == 0:
        p_cells = 1
    if decode > 0 and p_cells == width:
        p_cells = width - 1
    text.append("█" * p_cells, prefill_colour)
    text.append("█" * (width - p_cells), decode_colour)
    return text


def fill_bar(fraction: float | None, width: int, colour: str, empty_colour: str = "grey30") -> Text:
    """A progress bar of `width` cells with eighth-block precision."""
    text = Text()
    if width <= 0:
        return text
    fraction = 0.0 if fraction is None else max(0.0, min(1.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text.append("█" * full, colour)
    if full < width:
        partial_chars = " ▏▎▍▌▋▊▉"
        if part:
            text.append(partial_chars[part], colour)
        text.append("░" * (width - full - (1 if part else 0)), empty_colour)
    return text


def split_band(decode_shares: list[float | None], prefill_colour: str, decode_colour: str,
               idle_colour: str = "grey30", one_step: Collection[int] = ()) -> Text:
    """One row, a cell per round: decode's share of the units as an eighth block in the decode
    colour over the prefill colour (full block: all decode, blank: all prefill); None is idle (·);
    the rounds in `one_step` (their indices) ran prefill and decode in one forward on every unit, no
    split: `─`."""
    cells: list[tuple[str, str]] = []
    on = f"{decode_colour} on {prefill_colour}"
    for i, share in enumerate(decode_shares):
        if share is None:
            cells.append(("·", idle_colour))
        elif i in one_step:
            cells.append(("─", idle_colour))
        else:
            cells.append((EIGHTHS[max(0, min(8, round(share * 8)))], on))
    return merge_cells(cells)
