"""Events as the wire and the recordings hold them: JSON objects, and their text.

One encoder for every event: producers build the event classes (`pdtop.telemetry.events`, and the
engine's records, which are the stream's events), `wire` turns any of them into its JSON object
(`type`, `v`, then its fields as `plain` writes them) and `encode` into compact JSON text. Rounds,
requests and transfers, most of the stream, take a fast path straight from the dataclass to text
(`encode_record`, orjson). The server encodes each event once and sends the same text to every
client and the recorder; `pdtop.telemetry.decode.decode_event` turns it back into the same class.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from pdtop.engine.description import WIRE
from pdtop.engine.records import KvTransfer, RequestRecord, RoundRecord
from pdtop.json_text import json_text
from pdtop.telemetry.events import EVENT_TYPES, PROTOCOL_VERSION, Event, Reply, ReplyError

_dumps: Callable[[Any], bytes] | None
try:  # the stream's fast path; without it (the lent GPU machine) records take `encode`'s, and the CLI imports
    import orjson

    _dumps = orjson.dumps
except ImportError:
    _dumps = None


def wire(event: Event) -> dict[str, Any]:
    """An event as its JSON object: its `type`, the protocol version, its fields."""
    kind = EVENT_TYPES.get(event.__class__)
    if kind is None:
        raise TypeError(f"not an event: {event.__class__.__name__}")
    return {"type": kind, "v": PROTOCOL_VERSION, **plain(event)}


def encode(event: Event | dict[str, Any]) -> str:
    """An event (or an event's JSON object) as compact JSON; NaN and infinities (not JSON) become null."""
    return json_text(event if isinstance(event, dict) else wire(event))


def plain(value: Any) -> Any:
    """A record (an event, or `pdtop.engine.description`'s) as the JSON values of its object: each field
    a key, in field order, tuples as lists; a field with `FLAT` metadata writes its keys into the object
    itself, one with `IF_SET` is left out while None, one with `ABSENT` is no key and names the fields
    left out. Inside values typed `Any` (`runtime`, a device's facts) lists and dicts are copied and
    tuples become lists too; anything else is written as it is."""
    cls = value.__class__
    if cls in _SCALARS:  # most values: the cheapest test first
        return value
    if cls is list or cls is tuple:
        return [v if v.__class__ in _SCALARS else plain(v) for v in value]
    if cls is dict:
        return {k: plain(v) for k, v in value.items()}
    plan = _wire_fields(cls)
    if plan is None:  # not a dataclass
        return value
    fields, absent_field, simple = plan
    if simple:
        d = getattr(value, "__dict__", None)
        if d is not None and len(d) == len(fields):  # its fields, in field order: a copy is a third faster
            copy = d.copy()
            for k, v in d.items():
                if v.__class__ not in _SCALARS:
                    copy[k] = plain(v)
            return copy
    absent = getattr(value, absent_field) if absent_field else ()
    out: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for name, kind in fields:
        v = getattr(value, name)
        if kind == "flat":
            flat = v
        elif not (name in absent or (kind == "if_set" and v is None)):
            out[name] = v if v.__class__ in _SCALARS else plain(v)
    if flat:
        clash = out.keys() & flat.keys()
        if clash:  # one key, two values
            raise ValueError(f"{cls.__name__}: extra keys named like its fields: {sorted(clash)}")
        out.update({k: plain(v) for k, v in flat.items()})
    return out


_SCALARS = frozenset((int, float, str, bool, type(None)))


@functools.cache
def _wire_fields(cls: type) -> tuple[tuple[tuple[str, str | None], ...], str | None, bool] | None:
    """(field name, `WIRE` kind) of each field of a dataclass that is on the wire, its `ABSENT` field's name
    (None: none), and whether every field is simply a key (the engine's records); None for no dataclass."""
    if not dataclasses.is_dataclass(cls):
        return None
    kinds = [(f.name, f.metadata.get(WIRE)) for f in dataclasses.fields(cls)]
    return (tuple((name, kind) for name, kind in kinds if kind != "absent"),
            next((name for name, kind in kinds if kind == "absent"), None),
            bool(kinds) and all(kind is None for _, kind in kinds))


_RECORD_HEADS = {cls: f'{{"type":"{EVENT_TYPES[cls]}","v":{PROTOCOL_VERSION},'.encode()
                 for cls in (RoundRecord, RequestRecord, KvTransfer)}


def encode_record(rec: RoundRecord | RequestRecord | KvTransfer) -> str:
    """The event of a round, request or transfer record as JSON text, straight from the dataclass:
    orjson writes it about 12x faster than building the dict and `json.dumps` (9 us a record), which the
    engine thread pays for every event streamed. It parses to `wire(rec)`, non-finite floats as null as
    `encode` writes them; what orjson cannot write (or no orjson) takes `encode`'s path."""
    if _dumps is None:
        return encode(rec)
    try:
        body = _dumps(rec)
    except TypeError:
        return encode(rec)
    return (_RECORD_HEADS[rec.__class__] + body[1:]).decode()


def reply_event(msg_id: Any, ok: bool, field: str | None = None, reason: str | None = None,
                **extra: Any) -> dict[str, Any]:
    """The `reply` to one control message, as its JSON object: ok, or the field at fault and why;
    `extra` sets `Reply`'s other fields (`path`, `readonly`)."""
    error = None if ok else ReplyError(field, reason or "")
    return wire(Reply(id=msg_id, ok=ok, error=error, **extra))


