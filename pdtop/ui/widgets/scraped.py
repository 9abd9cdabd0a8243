"""The panels' pictures for a scraped `/metrics` page (`pdtop attach http://...`): each panel calls the
function for it when `state.scrape` is set. What the server does not expose says so, never 0."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.telemetry.events import Metrics, Quantiles
from pdtop.ui.chart import block_chart, fill_bar, split_bar
from pdtop.ui.scrape_view import NOT_EXPOSED, ScrapeView, number
from pdtop.ui.widgets import scraped_split

if TYPE_CHECKING:
    from pdtop.ui.widgets.base import Panel


def figure(value: float | str | None, shown: str) -> str:
    """`shown` for a finite figure; the word for NaN or an infinity (NaN, +Inf, -Inf)."""
    return value if isinstance(value, str) else shown


def percentile(q: Quantiles, value: float | str | None, shown: Callable[[float | None], str]) -> str:
    """A percentile as `shown` writes it; one in the lowest bucket as `< BOUND` (the histogram cannot tell
    where below its first bound it is: interpolating from 0 would invent a figure)."""
    number_ = number(value)
    if number_ is not None and q.first_bound_s is not None and number_ <= q.first_bound_s:
        return f"< {shown(q.first_bound_s)}"
    return figure(value, shown(number_))


def not_exposed(panel: Panel, what: str, view: ScrapeView) -> Group:
    """A panel whose figures no /metrics page has (rounds, prefill progress, bytes moved)."""
    panel.border_title, panel.border_subtitle = panel.TITLE, ""
    return Group(Text(f"{what}:", "dim"), Text.assemble((NOT_EXPOSED, "bold"), (f" ({view.engine_name})", "dim")))


def split(panel: Panel, view: ScrapeView, width: int) -> Group:
    """pdtop's own page has its split; vLLM and SGLang have none (SGLang's comes from its log or config)."""
    m = view.latest
    if m is not None and m.split is not None:
        return scraped_split.render(panel, view, m.split, width, panel.inner_height)
    if view.target.engine != "pdtop" or m is None or not view.exposed("split_level"):
        panel.border_title = "split"
        return Group(Text.assemble(("SM split: ", "dim"), (NOT_EXPOSED, "bold")),
                     Text(f"{view.engine_name} publishes no prefill/decode split of the GPU", "dim"))
    panel.border_title = "units split"
    p, d = number(m.prefill_units), number(m.decode_units)
    level = number(m.split_level)
    head = Text.assemble(f"level {figure(m.split_level, f'{level:.0f}' if level is not None else '–')}",
                         ("  from pdtop:split_level", "dim"))
    if p is None or d is None:
        return Group(head, Text(f"units: {figure(m.prefill_units, '?')} / {figure(m.decode_units, '?')}"))
    colours = panel.colour("prefill"), panel.colour("decode"), panel.colour("idle")
    legend = Text.assemble(("■ ", colours[0]), f"prefill {p:.0f}   ", ("■ ", colours[1]), f"decode {d:.0f}")
    return Group(head, split_bar(int(p), int(d), width, *colours), legend)


def _pair(label: str, q: Quantiles | None, exposed: bool, wide: bool) -> Text:
    if not exposed:
        return Text.assemble((f"{label:<5}", "dim"), (NOT_EXPOSED, "dim italic"))
    if q is None:
        return Text.assemble((f"{label:<5}", "dim"), "–")
    if q.note is not None:  # a histogram without +Inf and _count: no percentiles, never NaN
        return Text.assemble((f"{label:<5}", "dim"), "–  ", ("no +Inf bucket or _count: cannot be read"
                                                             if not wide else q.note, "dim"))
    shown = [(name, getattr(q, f"{name}_s")) for name in ("p50", "p90", "p99")]
    out = Text.assemble((f"{label:<5}", "dim"))
    for name, value in shown:
        if name == "p90" and not wide:
            continue
        out.append_text(Text.assemble((f"{name} ", "dim"), f"{percentile(q, value, fmt.duration)}  "))
    out.append(f"n={figure(q.count, fmt.count(number(q.count)))}", "dim")
    return out


def requests(panel: Panel, view: ScrapeView, width: int, height: int) -> Group:
    m = view.latest
    wide = width >= 46

    def gauge(name: str, value: float | str | None) -> str:
        if not view.exposed(name):
            return NOT_EXPOSED
        return figure(value, fmt.count(number(value)))

    if m is None:
        return Group(Text(f"waiting for the first read of {view.target.url}", "dim"))
    if not view.exposed("running") and not view.exposed("waiting"):  # said once, not run together
        load = Text.assemble(("running, waiting ", "dim"), (NOT_EXPOSED, "dim italic"))
    else:
        load = Text.assemble(("running ", "dim"), (f"{gauge('running', m.running):<5}", "bold"), ("  waiting ", "dim"),
                             (gauge("waiting", m.waiting), "bold"))
    kv = number(m.kv_usage)
    if view.exposed("kv_usage"):
        kv_colour = panel.colour("error") if kv is not None and kv > 0.9 else panel.colour("decode")
        kv_line = Text.assemble(("KV ", "dim"), fill_bar(kv, max(4, width - 10), kv_colour, panel.colour("idle")),
                                f" {figure(m.kv_usage, fmt.percent(kv))}")
    else:
        kv_line = Text.assemble(("KV ", "dim"), (NOT_EXPOSED, "dim italic"))
    lines = [load, kv_line]
    for label, name in (("TTFT", "ttft"), (itl_label(m), "itl"), ("E2E", "e2e")):
        lines.append(_pair(label, getattr(m, name), view.exposed(name), wide))
    tput = Text.assemble(("tok/s ", "dim"))
    for label, name, value in (("prompt ", "prompt_tokens_per_s", m.prompt_tokens_per_s),
                               ("  output ", "generation_tokens_per_s", m.generation_tokens_per_s)):
        shown = NOT_EXPOSED if not view.exposed(name) else figure(value, fmt.count(number(value)))
        tput.append_text(Text.assemble((label, "dim"), (shown, "bold")))
    lines.append(tput)
    if m.log is not None:
        lines.append(log_line(m, wide))
    if not view.log_only:
        window = "first read: rates from the next" if m.window_s == 0 else f"over the last {fmt.duration(m.window_s)}"
        lines.append(Text(f"percentiles and rates {window}" if wide else window, "dim"))
    return Group(*lines[:height])


FIGURES = ("running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s")
LOG_WORDS = {"running": "running", "waiting": "waiting", "kv_usage": "KV", "prompt_tokens_per_s": "prompt tok/s",
             "generation_tokens_per_s": "output tok/s"}


def itl_label(m: Metrics | None) -> str:
    """`ITL`, or `TPOT` where the page's per-token histogram is older SGLang's per-request mean."""
    return "TPOT" if m is not None and m.itl_metric is not None else "ITL"


def log_line(m: Metrics, wide: bool) -> Text:
    """Which figures SGLang's log gave (its Decode/Prefill batch lines), and how old its latest is."""
    assert m.log is not None
    words = [LOG_WORDS[f] for f in FIGURES if f in m.log.fields]
    if any(f not in LOG_WORDS for f in m.log.fields):
        words.append("PD queues")
    age = "latest batch line just now" if m.log.age_s < 1 else f"latest batch line {fmt.duration(m.log.age_s)} ago"
    ranks = f", {m.log.ranks} DP ranks" if m.log.ranks > 1 else ""
    if not wide:
        return Text(f"from SGLang's log, {age}", "dim")
    return Text(f"{', '.join(words)} from SGLang's log ({age}{ranks})", "dim")


LANES = (("ITL", "itl", "itl_p99_s"), ("TTFT", "ttft", "ttft_p99_s"), ("E2E", "e2e", "e2e_p99_s"))


def latency_chart(panel: Panel, view: ScrapeView, slo: float | None, width: int, height: int) -> Group:
    """p99 per read of ITL (with the SLO line), and of TTFT and E2E below it where there is room, newest
    on the right; the ITL percentiles now above them."""
    m = view.latest
    panel.border_title = "latency from /metrics"
    panel.border_subtitle = f"p99 over the last {fmt.duration(view.target.window_s)} at each read, newest right"
    lanes = [lane for lane in LANES if m is None or view.exposed(lane[1])]
    if not lanes:
        return not_exposed(panel, "latency histograms", view)
    itl = m.itl if m is not None else None
    head = Text.assemble((f"{itl_label(m)} p50 ", "dim"), percentile(itl, itl.p50_s, fmt.ms) if itl else "–",
                         ("  p99 ", "dim"), percentile(itl, itl.p99_s, fmt.ms) if itl else "–")
    if slo is not None:
        head.append_text(Text.assemble(("  SLO ", "dim"), (fmt.ms(slo), panel.colour("slo"))))
    axis = 9
    cols = max(4, width - axis)
    points = list(view.history)[-cols:]
    room = max(1, height - 1)
    small = 2 if room >= 2 * len(lanes) + 2 else 0  # rows of each lane after the first, if they fit
    lines = [head]
    for n, (label, _name, attr) in enumerate(lanes if small else lanes[:1]):
        values: list[float | None] = [None] * (cols - len(points))
        values += [getattr(p, attr) for p in points]
        line = slo if label == "ITL" else None
        rows_n = room - small * (len(lanes) - 1) if n == 0 else small
        top = max([v for v in values if v is not None] + [line * 1.25 if line else 0.0, 1e-3])
        rows = block_chart(values, rows_n, top, panel.colour("chart"), line, panel.colour("slo"), panel.colour("idle"))
        for i, row in enumerate(rows):
            drawn = line is not None or any(v is not None for v in values)  # nothing drawn: no scale to label
            shown = itl_label(m) if label == "ITL" else label
            name = shown if i == 0 else fmt.duration(top) if i == 1 and drawn else ""
            lines.append(Text.assemble((f"{name:>{axis - 1}} ", "dim"), row))
    return Group(*lines)
