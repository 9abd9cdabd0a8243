"""Timeline: the last rounds, one column each (newest on the right), in lanes that show how
prefill and decode interleave: the decode step of each round, the split as a band, and the
prefill in flight (its request ids, and its layers done by the end of each round as a rising
ramp). Under disagg the split lane becomes the transfer lane: KV bytes on the link."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pdtop import format as fmt
from pdtop.ui.chart import block_chart, split_band
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets import scraped, scraped_split
from pdtop.ui.widgets.base import Panel
from pdtop.ui.window_figures import RoundPoint

LABEL = 8  # the lane names' column


def _ids(ids: tuple[int, ...]) -> str:
    return f"#{ids[0]}" + (f"+{len(ids) - 1}" if len(ids) > 1 else "")


class TimelinePanel(Panel):
    TITLE = "timeline · rounds"
    LINE_API = True

    def render_state(self, state: DashboardState) -> Group:
        if state.scrape is not None:  # an SGLang server's split (its log or config) has a level band
            band = scraped_split.timeline(self, state.scrape, self.inner_width, self.inner_height)
            return band if band is not None else scraped.not_exposed(self, "rounds", state.scrape)
        width = max(4, self.inner_width - LABEL)
        height = self.inner_height
        rounds = state.last_rounds(width)
        pad: list[RoundPoint | None] = [None] * (width - len(rounds))
        cols: list[RoundPoint | None] = pad + list(rounds)
        ramp_rows = 2 if height >= 6 else 1
        id_rows = 1 if height >= 4 else 0
        decode_rows = max(1, height - ramp_rows - id_rows - 1)
        if rounds:
            span = rounds[-1].time - rounds[0].time + rounds[0].span_s
            self.border_subtitle = f"last {len(rounds)} rounds · {fmt.duration(span)} · newest on the right"
        else:
            self.border_subtitle = ""
        lines: list[Text] = []

        steps = [r.decode_step_s if r is not None and r.decode_bs > 0 else None for r in cols]
        slo = state.itl_slo_s
        top = max([v for v in steps if v is not None] + [1e-3])
        chart = block_chart(steps, decode_rows, top, self.colour("decode"), slo if slo and slo <= top else None,
                            self.colour("slo"), self.colour("idle"))
        shown = any(v is not None for v in steps)  # an empty lane has no scale to label
        for i, row in enumerate(chart):
            label = "decode" if i == 0 else fmt.ms(top) if i == 1 and shown else ""
            lines.append(Text.assemble((f"{label:<{LABEL}}", "dim"), row))

        if any(r is not None and r.transfer_bytes for r in cols) or state.policy == "disagg":
            lines.append(self._link_lane(cols))  # disagg: the split is fixed, the link is what moves
        else:
            lines.append(self._split_lane(rounds, len(pad), state.info.units))
        if id_rows:
            lines.append(Text.assemble((f"{'prefill':<{LABEL}}", "dim"), self._ids_row(cols, state)))
        ramp = [r.prefill_frac if r is not None and r.prefill_ids else None for r in cols]
        for i, row in enumerate(block_chart(ramp, ramp_rows, 1.0, self.colour("prefill"),
                                            grid_colour=self.colour("idle"))):
            label = "prefill" if not id_rows and i == 0 else "layers" if i == ramp_rows - 1 else ""
            lines.append(Text.assemble((f"{label:<{LABEL}}", "dim"), row))
        return Group(*lines)

    def _split_lane(self, rounds: list[RoundPoint], pad: int, units: int) -> Text:
        """Decode's share of the units per round; `─` where prefill and decode ran in one forward on every
        unit (chunked: no split), and the lane says `no split` when no round in view had one."""
        together = {i for i, r in enumerate(rounds) if r.prefill_units == r.decode_units == units and not r.idle}
        shares = [None if r.idle else
                  r.decode_units / (r.prefill_units + r.decode_units) if r.prefill_units + r.decode_units else 0.0
                  for r in rounds]
        band = split_band(shares, self.colour("prefill"), self.colour("decode"), self.colour("idle"), together)
        label = "no split" if rounds and len(together) + sum(r.idle for r in rounds) == len(rounds) else "split"
        return Text.assemble((f"{label:<{LABEL}}", "dim"), " " * pad, band)

    def _link_lane(self, cols: list[RoundPoint | None]) -> Text:
        """The transfer lane: KV bytes on the link at the end of each round, against the most in view."""
        values = [float(r.transfer_bytes) if r is not None and r.transfer_bytes else None for r in cols]
        top = max([v for v in values if v is not None] + [1.0])
        row = block_chart(values, 1, top, self.colour("accent"), grid_colour=self.colour("idle"))[0]
        return Text.assemble((f"{'link':<{LABEL}}", "dim"), row)

    def _ids_row(self, cols: list[RoundPoint | None], state: DashboardState) -> Text:
        """Each prefill's request ids where it starts (with its progress if it is still in flight), running
        on over the columns after it that no other prefill uses; shorter where there is less room (its first
        id only), `•` where even that does not fit."""
        width = len(cols)
        starts = [i for i, r in enumerate(cols) if r is not None and r.prefill_ids
                  and (i == 0 or (prev := cols[i - 1]) is None or prev.prefill_ids != r.prefill_ids)]
        now = {tuple(p.request_ids): p for p in state.prefills}
        chars = [" "] * width
        free = 0  # the first column after the labels written so far
        for n, i in enumerate(starts):
            r = cols[i]
            assert r is not None
            last = n == len(starts) - 1
            room = (starts[n + 1] if not last else width) - i
            label = _ids(r.prefill_ids)
            view = now.get(r.prefill_ids) if last else None
            if view is not None:  # in flight now: its progress, moved left to fit if the columns are free
                label += f" {view.layers_done}/{view.layers_total} layers, ETA {fmt.duration(view.eta_s)}"
                at = max(free, min(i, width - len(label) - 1))
                i, room = at, width - at
            if len(label) >= room:  # never a cut id (`#12…` reads as another request)
                ids = _ids(r.prefill_ids)
                if len(label) > len(ids) and room > len(ids) + 4:  # in flight: its progress is cut, not its ids
                    label = label[:room - 1] + "…"
                else:  # the ids, else the first id, else a dot
                    label = next((x for x in (ids, f"#{r.prefill_ids[0]}") if len(x) < room), "•")
            chars[i:i + len(label)] = label
            free = i + len(label) + 1
        return Text("".join(chars[:width]), self.colour("prefill"))
