"""Header: connection, device, model, weights (what the matmuls run on), policy, API URL, recording and dropped
events, fitted to one line.

The separators tighten first, then items take their short form, then the API item goes (the
status line and help still name the server), then the weights item (at 80 columns there is no room
for it beside the model's whole name), then the model's name is cut; the rest stay at every width.
"""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.widgets import Static

from pdtop import __version__
from pdtop.format import fit
from pdtop.ui.state import DashboardState

CONNECTION = {
    "connecting": ("◌ connecting", "warning"),
    "live": ("● live", "success"),
    "reconnecting": ("◌ reconnecting…", "warning"),
    "closed": ("✖ disconnected", "error"),
    "replay": ("▶ replay", "primary"),
}

Item = tuple[list[tuple[str, str]], list[tuple[str, str]]]  # (full, short): (text, style) parts


class HeaderBar(Static):
    """One line at the top of the screen."""

    _last: Text | None = None
    _asked: tuple[DashboardState, str, bool, bool, str] | None = None  # the last paint's arguments

    def on_resize(self, _event: events.Resize) -> None:
        """Fit the same header to the new width (a paused replay or a frozen screen has no new event to)."""
        if self._asked is not None:
            self.paint(*self._asked)

    @property
    def text(self) -> str:
        """What the header shows now, as plain text."""
        return self._last.plain if self._last is not None else ""

    def paint(self, state: DashboardState, connection: str, readonly: bool, frozen: bool = False,
              address: str = "") -> None:
        """`address`: where the source reads from, shown until the engine has described itself."""
        self._asked = (state, connection, readonly, frozen, address)
        colours = self.app.theme_variables
        label, key = CONNECTION.get(connection, (connection, "warning"))
        info = state.info
        status = [(label, "bold " + colours.get(key, ""))]
        if frozen:
            status.append(("  ❄ frozen", "bold " + colours.get("warning", "")))
        if readonly and connection != "replay":
            status.append(("  read-only", colours.get("warning", "")))
        items: list[Item] = [([("pdtop ", "bold " + colours.get("accent", "")), (__version__, "dim")],
                              [("pdtop", "bold " + colours.get("accent", ""))]),
                             (status, status)]
        if not state.hello:
            self._show(fitted([*items, ([(address, "")], [(address, "")])], max(20, self.content_size.width or 80),
                              len(items)))
            return
        if state.scrape is not None:  # a /metrics page: its engine, the model shown, how often it is read
            view, width = state.scrape, max(20, self.content_size.width or 80)
            if state.fleet is not None:  # one server of a fleet: which (Escape goes back to the fleet)
                where = view.target.url.split("//", 1)[-1].split("/", 1)[0]
                items.append(([("server ", "dim"), (where, "bold"), ("  esc: fleet", "dim")], [(where, "bold")]))
            page = " log" if view.log_only else " /metrics"  # SGLang without --enable-metrics: its log alone
            items.append(([(view.engine_name, "bold"), (page, "dim")], [(view.engine_name, "bold")]))
            items.append(([("model ", "dim"), (view.model_line, "")], [(view.target.model_name or "?", "")]))
            every = f"{view.target.interval_s:g} s"
            items.append(([("read every ", "dim"), (every, "")], [(every, "dim")]))
            self._show(fitted(items, width, len(items) - 2))
            return
        if info.server:  # pdtop's plugin inside another engine's scheduler
            items.append(([("in ", "dim"), (info.server, "bold")], [(info.server.split(" ")[0], "bold")]))
        if state.server_version and state.server_version != __version__:
            items.append(([("engine ", "dim"), (state.server_version, "")], [(state.server_version, "dim")]))
        units = f" · {info.units} {info.unit_name}" if f"{info.units} " not in info.device else ""
        # short: `cpu`, not `cpu (2 cores)`: the split panel's title and level table give the units
        items.append(([(info.device, "bold"), (units, "")], [(info.device.split(" (")[0], "bold")]))
        model_at = len(items)
        items.append(([("model ", "dim"), (info.model, "")], [(info.model.removeprefix("synthetic:"), "")]))
        weights_at = None
        if info.weights:  # which path the matmuls run: "gguf Q4_1+Q8_0 (avx512-vnni)", short "gguf avx512-vnni"
            weights_at = len(items)
            items.append(([(info.weights, "")], [(short_weights(info.weights), "")]))
        items.append(([("policy ", "dim"), (state.policy, "")], [(state.policy, "")]))
        api_at = None
        if state.api and connection != "replay":
            port = state.api.rsplit(":", 1)[-1].split("/")[0]
            api_at = len(items)
            items.append(([("api ", "dim"), (state.api, "")], [("api ", "dim"), (f":{port}", "")]))
        if connection != "replay":
            if state.recording:
                rec_style = "bold " + colours.get("error", "")
                items.append(([("◉ REC ", rec_style), (state.recording, "")], [("◉ REC", rec_style)]))
            elif state.recording_known:
                items.append(([("○ not recording", "dim")], [("○ no rec", "dim")]))
            else:  # a server that does not say (before hello.recording)
                items.append(([("recording: unknown", "dim")], [("rec ?", "dim")]))
        dropped_style = colours.get("warning", "") if state.dropped else "dim"
        items.append(([("dropped ", "dim"), (str(state.dropped), dropped_style)],
                      [("dropped ", "dim"), (str(state.dropped), dropped_style)]))
        optional = [i for i in (api_at, weights_at) if i is not None]
        self._show(fitted(items, max(20, self.content_size.width or 80), model_at, optional))

    def _show(self, text: Text) -> None:
        if text != self._last:
            self._last = text
            self.update(text, layout=False)


def short_weights(weights: str) -> str:
    """`gguf Q4_1+Q8_0 (avx512-vnni)` -> `gguf avx512-vnni` (the kernel path); float dtypes as they are."""
    if weights.startswith("gguf ") and weights.endswith(")") and " (" in weights:
        return "gguf " + weights.rsplit(" (", 1)[1][:-1]
    return weights


def fitted(items: list[Item], width: int, model_item: int, optional: Sequence[int] = ()) -> Text:
    """The items joined to fit `width`: wide separators and full forms if they fit, else tighter;
    the `optional` items go, one at a time in that order, before the model's name is cut."""
    def build(sep: str, short: int, model_room: int | None = None) -> list[list[tuple[str, str]]]:
        # items from the end take their short form first (`short` of them), the first items last
        chosen = [full if i < len(items) - short else brief for i, (full, brief) in enumerate(items)]
        if model_room is not None:
            parts = chosen[model_item]
            chosen[model_item] = [(fit(parts[-1][0], model_room), parts[-1][1])]
        return chosen

    def width_of(chosen: list[list[tuple[str, str]]], sep: str) -> int:
        return sum(len(t) for parts in chosen for t, _ in parts) + len(sep) * (len(chosen) - 1)

    tries = [("  │  ", 0)] + [(" │ ", short) for short in range(len(items) + 1)]
    for sep, short in tries:
        chosen = build(sep, short)
        if width_of(chosen, sep) <= width:
            return _join(chosen, sep)
    sep = " │ "
    model_of = items[model_item]
    for drop in [items[i] for i in optional]:  # by identity: indices shift as items go
        items = [item for item in items if item is not drop]
        model_item = next(i for i, item in enumerate(items) if item is model_of)
        chosen = build(sep, len(items))
        if width_of(chosen, sep) <= width:
            return _join(chosen, sep)
    over = width_of(chosen, sep) - width
    model = chosen[model_item][-1][0]
    chosen = build(sep, len(items), max(3, len(model) - over))
    return _join(chosen, sep)


def _join(chosen: list[list[tuple[str, str]]], sep: str) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, parts in enumerate(chosen):
        if i:
            text.append(sep, "dim")
        for t, style in parts:
            text.append(t, style or None)
    return text
