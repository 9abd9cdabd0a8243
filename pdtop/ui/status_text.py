"""The status line between notices: why there is no connection, how to get controls, or what runs
(the workload) and where help is."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from rich.text import Text

from pdtop.telemetry.sources.source import Source
from pdtop.ui.state import DashboardState


@dataclass(frozen=True)
class Shown:
    """What else the status line depends on: the app's view of its source and screen."""

    readonly: bool
    frozen: bool
    hint: str | None  # a panel's hint that did not fit on the panel
    width: int  # cells the line has
    warning: str  # the theme's warning style
    source_error: str | None  # why the source stopped, if it failed


def status_text(state: DashboardState, source: Source, shown: Shown) -> Text:
    url, error, replay = source.url, source.last_error, source.transport is not None
    if source.state in ("connecting", "reconnecting") and error:
        retry_at = source.retry_at
        wait = max(0.0, retry_at - time.monotonic()) if retry_at is not None else None
        retry = f"retrying in {wait:.0f} s" if wait is not None and wait >= 0.5 else "retrying now"
        full = Text.assemble((f"cannot reach {url}: ", shown.warning), error, ("  ·  ", "dim"), retry)
        if full.cell_len <= shown.width - 2:
            return full
        return Text.assemble((error, shown.warning), ("  ·  ", "dim"), retry)  # the address is in the header
    if source.state == "connecting":
        return Text(f"connecting to {url}…", "dim")
    if source.state == "closed" and not replay:
        return Text.assemble((f"disconnected from {url}", shown.warning),
                             (f": {shown.source_error}" if shown.source_error else "", ""))
    parts: list[Text] = []
    if shown.frozen:
        parts.append(Text("frozen: f follows the engine again (events are still taken)", "bold " + shown.warning))
    elif not replay and shown.readonly and not source.want_readonly:
        parts.append(Text.assemble(("read-only: ", shown.warning), source.readonly_reason or "no control token"))
    if shown.hint:
        parts.append(Text(shown.hint, "dim"))
    workload = state.info.workload
    paused = state.config is not None and state.config.workload_paused
    for short in (False, True):  # narrow: the workload without its details, then without the help hint
        if workload and short:
            workload = re.sub(r" \([^)]*\)", "", workload)
        if workload and paused:  # described as it runs, it would read as running
            told = Text.assemble(("workload ", "dim"), ("paused", "bold " + shown.warning),
                                 ": nothing arrives but injected and API requests (w resumes)" if not short else "")
        else:
            told = Text.assemble(("workload ", "dim"), workload or "")
        line = [*parts, told] if workload else list(parts)
        text = Text("  ·  ", "dim").join([*line, Text("? help  ctrl+p commands", "dim")])
        if text.cell_len <= shown.width - 2:
            return text
    return Text("  ·  ", "dim").join(line)  # the footer has `? help`
