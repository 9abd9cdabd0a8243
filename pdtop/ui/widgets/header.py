"""Header: engine, device, model, policy, API URL, connection, recording and dropped events."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from pdtop import __version__
from pdtop.ui.state import DashboardState

CONNECTION = {
    "connecting": ("◌ connecting", "warning"),
    "live": ("● live", "success"),
    "reconnecting": ("◌ reconnecting…", "warning"),
    "closed": ("✖ disconnected", "error"),
    "replay": ("▶ replay", "primary"),
}


class HeaderBar(Static):
    """One line at the top of the screen."""

    _last: Text | None = None

    @property
    def text(self) -> str:
        """What the header shows now, as plain text."""
        return self._last.plain if self._last is not None else ""

    def paint(self, state: DashboardState, connection: str, readonly: bool) -> None:
        colours = self.app.theme_variables
        sep = ("  │  ", "dim")
        label, key = CONNECTION.get(connection, (connection, "warning"))
        info = state.info
        text = Text.assemble(
            ("pdtop ", "bold " + colours.get("accent", "")), (__version__, "dim"), sep,
            (label, "bold " + colours.get(key, "")),
        )
        if readonly and connection != "replay":
            text.append("  read-only", colours.get("warning", ""))
        if state.server_version and state.server_version != __version__:
            text.append_text(Text.assemble(sep, ("engine ", "dim"), state.server_version))
        units = f" · {info.units} {info.unit_name}" if f"{info.units} " not in info.device else ""
        model = info.model if len(info.model) <= 32 else info.model[:31] + "…"
        text.append_text(Text.assemble(
            sep, (info.device, "bold"), units, sep, ("model ", "dim"), model, sep, ("policy ", "dim"), state.policy,
        ))
        if state.api and connection != "replay":
            text.append_text(Text.assemble(sep, ("api ", "dim"), state.api))
        if connection != "replay":
            rec = Text.assemble(("◉ REC ", "bold " + colours.get("error", "")), state.recording) if state.recording \
                else Text("○ not recording", "dim")
            text.append_text(Text.assemble(sep, rec))
        dropped_style = colours.get("warning", "") if state.dropped else "dim"
        text.append_text(Text.assemble(sep, ("dropped ", "dim"), (str(state.dropped), dropped_style)))
        if text != self._last:
            self._last = text
            self.update(text, layout=False)
