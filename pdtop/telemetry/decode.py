"""A received JSON object -> a typed event (`pdtop.telemetry.events`), checked once.

The `type` picks the class and `v` must be this protocol's version; the fields are checked by
`pdtop.typed_json.decode_as`, the one decoder of what pdtop receives (its docstring says what
it checks and why it is pdtop's own). Anything invalid raises `EventError`, one line naming
the field (`round.prefills[0].layers_done: expected an integer, got '3'`); a `type` this pdtop
does not know raises `UnknownEventType`, which consumers skip and count.
"""
from __future__ import annotations

from typing import Any

from pdtop.telemetry.events import EVENT_CLASSES, PROTOCOL_VERSION, Event, Hello
from pdtop.typed_json import DecodeError, decode_as, show


class EventError(DecodeError):
    """Not a valid event; the message says which field and why, in one line."""


class UnknownEventType(EventError):
    """An event type this pdtop does not know (a newer server's): skip it."""


def decode_event(obj: Any) -> Event:
    """One event object (parsed JSON) -> its typed event; `EventError` if it is not valid."""
    if not isinstance(obj, dict):
        raise EventError(f"an event is a JSON object, not {show(obj)}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise EventError(f"an event needs a string 'type', got {show(kind)}")
    cls = EVENT_CLASSES.get(kind)
    if cls is None:
        raise UnknownEventType(f"unknown event type {kind!r}")
    version = obj.get("v")
    if version.__class__ is not int or version != PROTOCOL_VERSION:
        raise EventError(f"{kind}: protocol version {show(version)}; this pdtop reads version {PROTOCOL_VERSION}")
    try:
        event: Event = decode_as(cls, obj, kind)
    except DecodeError as exc:
        raise EventError(str(exc), exc.field, exc.reason) from None
    if isinstance(event, Hello):
        if "pdtop" not in obj:  # its default is the writer's version, which a reader must not claim
            raise EventError("hello.pdtop: missing", "pdtop", "missing")
        if event.engine is None and event.scrape is None and event.fleet is None:
            raise EventError("hello: 'engine', 'scrape' and 'fleet' are all null; one of them says what the events "
                             "come from")
    return event
