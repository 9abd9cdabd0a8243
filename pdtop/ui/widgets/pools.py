"""Under `disagg`, the split panel shows the two instances instead of one device's split: the prefill
instance's queue, its batch in flight and its KV pool; the link with its transfers and bytes in
flight; the decode instance's batch, ITL and KV pool (`round.disagg`, `transfer` events)."""
from __future__ import annotations

import statistics

from rich import filesize
from rich.text import Text

from pdtop import format as fmt
from pdtop.engine.records import DisaggState
from pdtop.ui.chart import fill_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.base import Panel

TWO_COLUMNS = 76  # below this width the instances are stacked


def _bytes(n: float) -> str:
    return filesize.decimal(int(n), precision=1)


def _kv(label: str, used: int, capacity: int, width: int, colour: str, empty: str) -> Text:
    share = used / capacity if capacity else None
    tail = f" {fmt.percent(share)} {fmt.count(used)}/{fmt.count(capacity)}"
    bar = max(3, width - len(label) - len(tail) - 1)
    return Text.assemble((label, "dim"), " ", fill_bar(share, bar, colour, empty), tail)


def _itl_p50(state: DashboardState) -> float | None:
    gaps = [r.itl_s for r in state.window() if r.itl_s is not None]
    return statistics.median(gaps) if gaps else None


def prefill_lines(panel: Panel, state: DashboardState, d: DisaggState, width: int) -> list[Text]:
    colour, idle = panel.colour("prefill"), panel.colour("idle")
    unit = state.info.unit_name
    head = Text.assemble(("■ ", colour), ("prefill instance", "bold"), f" · {fmt.units(d.prefill_units, unit)}")
    queue = Text.assemble(("queue ", "dim"), f"{d.reserving} wait for slots · {d.prefill_queue} reserved · "
                                             f"{d.prefilling} prefilling")
    if queue.cell_len > width:
        queue = Text.assemble(("queue ", "dim"), f"{d.reserving} wait · {d.prefill_queue} resv · {d.prefilling} run")
    p = state.prefills[0] if state.prefills else None
    if p is None:
        batch = Text("no prefill in flight", "dim")
    else:
        ids = f"#{p.request_ids[0]}" + (f"+{len(p.request_ids) - 1}" if len(p.request_ids) > 1 else "")
        tail = f" {p.layers_done}/{p.layers_total} layers"
        label = f"{ids} {fmt.count(p.tokens)} tok "
        batch = Text.assemble(label, fill_bar(p.layers_done / p.layers_total if p.layers_total else None,
                                              max(3, width - len(label) - len(tail)), colour, idle), tail)
    kv = _kv("KV", d.prefill_kv_used_tokens, d.prefill_kv_capacity_tokens, width, colour, idle)
    return [head, queue, batch, kv]


def decode_lines(panel: Panel, state: DashboardState, width: int) -> list[Text]:
    colour, idle = panel.colour("decode"), panel.colour("idle")
    unit = state.info.unit_name
    head = Text.assemble(("■ ", colour), ("decode instance", "bold"), f" · {fmt.units(state.decode_units, unit)}")
    batch = Text.assemble(("decoded ", "dim"), f"{state.decode_bs} last round · {state.running} running · ITL p50 ",
                          (fmt.ms(_itl_p50(state)), "bold"))
    if batch.cell_len > width:
        batch = Text.assemble(("decoded ", "dim"), f"{state.decode_bs} · ITL p50 ", (fmt.ms(_itl_p50(state)), "bold"))
    kv = _kv("KV", state.kv_used, state.kv_capacity, width, colour, idle)
    return [head, batch, Text("never prefills: slots reserved first", "dim"), kv]


def link_line(panel: Panel, state: DashboardState, d: DisaggState, width: int) -> Text:
    """The link, its transfers and bytes in flight, and the last transfer where there is room."""
    last = state.transfers[-1] if state.transfers else None
    tail = "" if last is None else (f" · last #{last.request_id} {_bytes(last.bytes)} in "
                                    f"{fmt.duration(last.end - last.start)}")
    arrow = ("⇢ ", panel.colour("accent"))
    for words in (f"{d.transfers} transfers, ", f"{d.transfers} xfer "):
        line = Text.assemble(arrow, ("link ", "bold"), f"{d.link}: {words}", (_bytes(d.transfer_bytes), "bold"),
                             " in flight")
        if line.cell_len + len(tail) <= width:
            return line + Text(tail)
        if line.cell_len <= width:
            return line
    return _fit(Text.assemble(arrow, f"{d.link} ", (_bytes(d.transfer_bytes), "bold")), width)


def _fit(text: Text, width: int) -> Text:
    text.truncate(width, overflow="ellipsis")
    return text


def pool_lines(panel: Panel, state: DashboardState, d: DisaggState, width: int, height: int) -> list[Text]:
    """The two instances in `height` lines: side by side when `width` allows, else stacked."""
    if width >= TWO_COLUMNS:
        half = (width - 2) // 2
        left, right = prefill_lines(panel, state, d, half), decode_lines(panel, state, half)
        rows = []
        for a, b in zip(left, right, strict=True):
            a.truncate(half, overflow="ellipsis", pad=True)
            rows.append(Text.assemble(a, "  ", b))
        lines = [rows[0], link_line(panel, state, d, width), *rows[1:]]
    else:
        p, q = prefill_lines(panel, state, d, width), decode_lines(panel, state, width)
        lines = [p[0], p[2], link_line(panel, state, d, width), q[0], q[1], p[1], q[3], p[3]]
    return [_fit(line, width) for line in lines[:height]]
