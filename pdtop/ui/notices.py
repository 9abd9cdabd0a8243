"""What the operator is told when an event comes in: a `Notice` for the status line, or nothing."""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.telemetry.events import ConfigEvent, Dropped, ErrorNotice
from pdtop.ui.state import DashboardState
from pdtop.ui.words import change_words


@dataclass(frozen=True)
class Notice:
    message: str
    title: str
    severity: str = "information"  # "information" | "warning" | "error"
    timeout: float = 4.0


def notice_for(event: object, state: DashboardState, dropped_before: int) -> Notice | None:
    """The notice for `event` (None: an event that could not be read), already taken into `state`;
    `dropped_before` is `state.dropped` at the connection's hello."""
    if isinstance(event, ConfigEvent):
        if event.client == state.client_id:  # ours were said when the reply came
            return None
        who = f"{event.client}: " if event.client else ""
        return Notice(who + change_words(event.changes, state), "changed")
    if isinstance(event, Dropped) and dropped_before == state.dropped - event.count:
        return Notice(f"the server skipped {event.count} events this dashboard did not take in time; "
                      "the charts have a gap there", "dropped", "warning", 8)
    if isinstance(event, ErrorNotice):
        return Notice(f"{event.field or 'engine'}: {event.reason}", "pdtop server" if state.scrape is None
                      else "/metrics", "error", 8)
    if event is None and state.invalid == 1:  # the first only: a server bug floods
        return Notice(state.invalid_reason, "unreadable event skipped", "warning", 8)
    return None
