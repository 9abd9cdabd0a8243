"""The fleet screen (`pdtop attach URL URL ...`): one row per server, with its role, figures and address;
the KV-transfer panel; the prefill:decode balance in words. Enter on a row opens that server's
single-server view (the main screen); Escape there comes back here."""
from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Label, Static

from pdtop import format as fmt
from pdtop.telemetry.events import FleetServer, Metrics
from pdtop.telemetry.sources.source import Transport
from pdtop.ui.fleet_view import FleetView, show_server
from pdtop.ui.scrape_view import number
from pdtop.ui.state import DashboardState
from pdtop.ui.widgets.fleet_table import FleetTable
from pdtop.ui.widgets.replay_bar import ReplayBar
from pdtop.visible import visible

WIDE = 120  # columns from which the table has every column
# (name, width) of the table's columns; 80 columns drop TTFT (the server's own view has it), queues, engine
COLUMNS = (("role", 8), ("address", 22), ("state", 42), ("run", 5), ("wait", 5), ("KV", 5), ("TTFT p99", 9),
           ("ITL p99", 9), ("tok/s", 7), ("queues", 22), ("engine", 6))
NARROW = {1: 21, 2: 14, 3: 4, 4: 4, 5: 4, 7: 8, 8: 6}  # the widths that differ at 80 columns
NARROW_DROPPED = (6, 9, 10)
ROLE_STYLE = {"prefill": "prefill", "decode": "decode"}


def _n(value: float | str | None, unit: str = "") -> str:
    if isinstance(value, str):
        return value
    return "–" if value is None else f"{fmt.count(value)}{unit}"


def _p99(m: Metrics | None, name: str) -> str:
    q = getattr(m, name) if m is not None else None
    if q is None or q.p99_s is None:
        return "–"
    if isinstance(q.p99_s, str):
        return q.p99_s
    return fmt.ms(q.p99_s) if name == "itl" else fmt.duration(q.p99_s)


def queues(s: FleetServer) -> str:
    """The disaggregation queues of a server's side."""
    d = s.metrics.disagg if s.metrics is not None else None
    if d is None:
        return ""
    if s.role == "prefill" and (d.prefill_bootstrap_queue, d.prefill_inflight_queue) != (None, None):
        return f"boot {_n(d.prefill_bootstrap_queue)} · infl {_n(d.prefill_inflight_queue)}"
    if s.role == "decode" and (d.decode_prealloc_queue, d.decode_transfer_queue) != (None, None):
        return f"prealloc {_n(d.decode_prealloc_queue)} · xfer {_n(d.decode_transfer_queue)}"
    return ""


def transfer_lines(servers: list[FleetServer], width: int) -> list[Text]:
    """The KV-transfer panel: latency (ms), speed (GB/s), size and failures of each server that has them."""
    lines: list[Text] = []
    for s in servers:
        d = s.metrics.disagg if s.metrics is not None else None
        if d is None or all(v is None for v in (d.kv_transfer_latency_ms, d.kv_transfer_speed_gb_s,
                                                d.transfer_failures, d.bootstrap_failures)):
            continue
        latency = number(d.kv_transfer_latency_ms)
        speed = number(d.kv_transfer_speed_gb_s)
        size = number(d.kv_transfer_mb)
        address = fmt.fit(visible(s.address, 60), 22)
        line = Text.assemble((f"{visible(s.role, 10):<8}", "bold"), (f"{address:<23}", "dim"),
                             ("latency ", "dim"), f"{fmt.ms(latency / 1e3) if latency is not None else '–':>9}  ",
                             ("speed ", "dim"), f"{f'{speed:.1f} GB/s' if speed is not None else '–':>10}  ")
        if width >= WIDE:
            line.append_text(Text.assemble(("size ", "dim"), f"{f'{size:.0f} MB' if size is not None else '–':>7}  ",
                                           ("failed ", "dim"), f"bootstrap {_n(d.bootstrap_failures)} · transfer "
                                           f"{_n(d.transfer_failures)} · retries {_n(d.prefill_retries)}",
                                           (f"  ({d.transfer_metrics})" if d.transfer_metrics else "", "dim")))
        elif d.transfer_failures:
            line.append(f"failed {_n(d.transfer_failures)}", "bold")
        if s.state != "live":
            line.stylize("dim")
        lines.append(line)
    if not lines:
        lines.append(Text("no KV-transfer metrics on these pages (SGLang --disaggregation-mode, vLLM's NixlConnector)",
                          "dim"))
    return lines


class FleetScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "app.quit", "quit", id="fleet.quit")]
    DEFAULT_CSS = """
    FleetScreen { layout: vertical; }
    FleetScreen #fleet-head { height: 1; padding: 0 1; }
    FleetScreen #fleet-columns { height: 1; padding: 0 1; }
    FleetScreen FleetTable { padding: 0 1; }
    FleetScreen #fleet-kv { height: auto; max-height: 8; border: round $accent; padding: 0 1; }
    FleetScreen #fleet-balance { height: auto; padding: 0 1; }
    FleetScreen .hint { height: 1; padding: 0 1; color: $text-muted; }
    FleetScreen #fleet-replay-bar { height: 1; padding: 0 1; background: $panel; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._painted: tuple[object, ...] = ()
        self._wide: bool | None = None

    @property
    def dashboard(self) -> DashboardState:
        return self.app.state  # type: ignore[attr-defined]  # the pdtop app's

    @property
    def transport(self) -> Transport | None:
        """The replay's controls (a recorded fleet), else None."""
        return self.app.source.transport  # type: ignore[attr-defined]  # the pdtop app's

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-head")
        yield Static(id="fleet-columns")
        yield FleetTable(id="fleet-table")
        yield Static(id="fleet-kv")
        yield Static(id="fleet-balance")
        if self.transport is not None:  # a recorded fleet: where in the recording, and its keys
            yield ReplayBar(id="fleet-replay-bar")
            yield Label("↑↓ choose · enter: that server's view · space play/pause · ←→ seek 5 s · . step · "
                        "q: quit", classes="hint")
        else:
            yield Label("↑↓ choose · enter: that server's view (escape there: back here) · q: quit", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#fleet-kv", Static).border_title = "KV transfer"
        self.query_one(FleetTable).focus()
        self.set_interval(0.25, self.paint, name="pdtop-fleet")
        self.paint()

    def on_resize(self) -> None:
        self.paint()

    def paint(self) -> None:
        if (transport := self.transport) is not None:
            self.query_one(ReplayBar).paint(transport)
        fleet = self.dashboard.fleet
        if fleet is None:
            return
        wide = self.size.width >= WIDE
        key = (fleet.time, len(fleet.servers), wide, self.size)
        if key == self._painted:
            return
        self._painted = key
        if wide != self._wide:
            self._wide = wide
            self.query_one("#fleet-columns", Static).update(Text(self._line(
                [name for name, _ in COLUMNS], wide), "bold dim"))
        self.query_one(FleetTable).show([(s.url, self._row(s, wide)) for s in fleet.servers])
        self.query_one("#fleet-head", Static).update(self._head(fleet))
        self.query_one("#fleet-kv", Static).update(Text("\n").join(transfer_lines(fleet.servers, self.size.width)))
        severity, words = fleet.balance()
        colour = self.app.theme_variables.get("warning", "yellow") if severity == "warning" else ""
        self.query_one("#fleet-balance", Static).update(Text.assemble(("P:D ", "dim"), (words, colour)))

    def _head(self, fleet: FleetView) -> Text:
        roles = {r: sum(s.role == r for s in fleet.servers) for r in ("prefill", "decode", "unified")}
        live = sum(s.state == "live" for s in fleet.servers)
        stale = sum(s.state == "stale" for s in fleet.servers)
        shown = ", ".join(f"{n} {r}" for r, n in roles.items() if n)
        replay = self.transport is not None  # the rows are as recorded, not live
        head = Text.assemble(("▶ replay · ", "bold " + self.app.theme_variables.get("primary", "")) if replay else "",
                             ("fleet ", "bold"), f"{len(fleet.servers)} servers ({shown}) · ", (f"{live} live", "bold"),
                             (" when recorded", "dim") if replay else "")
        if stale:
            head.append(f" · {stale} stale", "bold " + self.app.theme_variables.get("error", "red"))
        head.append(f" · read every {fmt.duration(fleet.target.interval_s)}", "dim")
        if fleet.target.router:
            head.append(f" · router {visible(fleet.target.router, 100)}", "dim")
        return head

    @staticmethod
    def _line(cells: list[str], wide: bool) -> str:
        out = []
        for i, ((_, width), cell) in enumerate(zip(COLUMNS, cells, strict=False)):
            if not wide and i in NARROW_DROPPED:
                continue
            width = width if wide else NARROW.get(i, width)
            out.append(fmt.fit(cell, width).ljust(width))
        return " ".join(out).rstrip()

    def _row(self, s: FleetServer, wide: bool) -> Text:
        """One server's line: stale or not yet read, dimmed; the role in its side's colour."""
        m = s.metrics
        state = s.state if s.reason is None else f"{s.state}: {visible(s.reason, 200)}"
        kv = number(m.kv_usage) if m is not None else None
        role = visible(s.role, 10)
        address = visible(s.address, 60) + (f" DP×{len(s.dp_ranks)}" if s.dp_ranks else "")  # a gateway's ranks
        cells = [role, address, state, _n(m.running if m else None), _n(m.waiting if m else None),
                 fmt.percent(kv), _p99(m, "ttft"), _p99(m, "itl"), _n(m.generation_tokens_per_s if m else None),
                 queues(s), visible(s.engine or "?", 10)]
        line = Text(self._line(cells, wide), "dim" if s.state != "live" else "", no_wrap=True, overflow="crop")
        colour = self.app.theme_variables.get(ROLE_STYLE.get(s.role, ""), "")
        line.stylize(f"bold {colour}".strip(), 0, len(role))
        if s.state == "stale":
            start = 9 + (COLUMNS[1][1] if wide else NARROW[1]) + 1
            line.stylize("bold", start, start + len(fmt.fit(state, COLUMNS[2][1] if wide else NARROW[2])))
        return line

    def on_fleet_table_chosen(self, event: FleetTable.Chosen) -> None:
        fleet = self.dashboard.fleet
        if fleet is None:
            return
        show_server(self.dashboard, fleet.select(event.key))
        self.app.pop_screen()
        self.app.repaint_soon()  # type: ignore[attr-defined]
