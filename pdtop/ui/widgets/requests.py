"""Requests: running / waiting (after the last round) and the requests its decode step decoded, KV usage,
TTFT, ITL and TPOT (vLLM's definitions), output throughput and request counts. Lines are dropped or
shortened, never cut, when the panel is small."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.ui.chart import fill_bar
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped
from pdtop.ui.widgets.base import Panel
from pdtop.ui.window_figures import output_throughput


def _pair(label: str, p50: str, p99: str, note: str, wide: bool) -> Text:
    pad = 9 if wide else 0
    return Text.assemble((f"{label:<5}", "dim"), ("p50 ", "dim"), f"{p50:<{pad}}", ("  p99 " if not wide else "p99 ",
                         "dim"), f"{p99:<{pad}}", (note if wide else "", "dim"))


class RequestsPanel(Panel):
    TITLE = "requests"

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:
            return scraped.requests(self, state.scrape, self.inner_width, self.inner_height)
        width, height = self.inner_width, self.inner_height
        if not state.hello:  # not connected yet: no counts to show as 0
            return Group(Text.assemble(("requests, KV: ", "dim"), ("nothing known yet", "bold")))
        wide = width >= 46
        kv = state.kv_usage
        kv_colour = self.colour("error") if kv is not None and kv > 0.9 else self.colour("decode")
        load = _load(state.running, state.waiting, state.decode_bs, width)
        kv_text = f" {fmt.percent(kv)} "
        kv_line = Text.assemble(("KV ", "dim"), fill_bar(kv, max(4, width - 20), kv_colour, self.colour("idle")),
                                kv_text, (f"{fmt.count(state.kv_used)}/{fmt.count(state.kv_capacity)}"
                                          if state.kv_capacity else "not known yet", "dim"))
        ttft50, ttft99 = state.ttft_summary()
        itl50, itl99, _ = state.itl_summary()
        tpot50, tpot99 = state.tpot_summary()
        ttft = _pair("TTFT", fmt.duration(ttft50), fmt.duration(ttft99), "", wide)
        itl = _pair("ITL", fmt.ms(itl50), fmt.ms(itl99), "token gaps", wide)
        if tpot50 is None and state.running:  # TPOT is a finished request's: say why it is not there yet
            tpot = Text.assemble(("TPOT ", "dim"), ("– until a request finishes", "dim"))
        else:
            tpot = _pair("TPOT", fmt.ms(tpot50), fmt.ms(tpot99), "per request", wide)
        out = Text.assemble(("output ", "dim"), (f"{fmt.count(output_throughput(state.window()))} tok/s", "bold"),
                            ("  over the last ", "dim") if wide else "", (fmt.duration(state.window_s), "dim") if wide
                            else "")
        counts = Text.assemble(("arrived ", "dim"), fmt.count(state.arrivals),
                               ("  first token ", "dim") if wide else "", fmt.count(state.first_tokens) if wide else "",
                               ("  finished ", "dim"), fmt.count(state.finished))
        if state.rejected or wide:
            counts.append_text(Text.assemble(("  rejected ", "dim"), fmt.count(state.rejected)))
        since = Text(f"counts since {state.counts_since}", "dim")
        lines = [load, kv_line, ttft, itl, tpot, out, counts, since]
        if len(lines) > height:
            lines.remove(since)
        if len(lines) > height:  # KV joins the first line, which drops its padding so the percentage fits
            lines[0] = _load_with_kv(state.running, state.waiting, state.decode_bs, fmt.percent(kv), width)
            lines.remove(kv_line)
        return Group(*lines[:height])


def _load(running: int, waiting: int, decoded: int, width: int) -> Text:
    """`running 49   waiting 0    decoded 50 last round`: running and waiting are counted after the round, the
    decode batch is the round's own (a request that finished in it is no longer running), so the batch is
    said as what the last round did, not beside running as if both were now."""
    for run, wait, done, pad in (("running ", "waiting ", " last round", 5), ("run ", "wait ", " last round", 4),
                                 ("run ", "wait ", "", 4)):
        text = Text.assemble((run, "dim"), (f"{running:<{pad}}", "bold"), (wait, "dim"), (f"{waiting:<{pad}}", "bold"),
                             ("decoded ", "dim"), str(decoded), (done, "dim"))
        if text.cell_len <= width:
            break
    return text


def _load_with_kv(running: int, waiting: int, decoded: int, kv: str, width: int) -> Text:
    """`run 11 wait 0 decoded 11 KV 31%`, with `dec` where even that is wider than the panel."""
    for decoded_label, gap in (("decoded ", "  "), ("decoded ", " "), ("dec ", " ")):
        text = Text.assemble(("run ", "dim"), (str(running), "bold"), (f"{gap}wait ", "dim"), (str(waiting), "bold"),
                             (f"{gap}{decoded_label}", "dim"), str(decoded), (f"{gap}KV ", "dim"), kv)
        if text.cell_len <= width:
            break
    return text
