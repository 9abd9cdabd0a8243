"""Events as the wire and the recordings hold them: dicts, and their JSON text.

Engine records become events with their dataclass fields (rounds and requests straight to
JSON text: they are most of the stream); the engine's description and configuration
(`pdtop.engine.description`) become the `engine` and `config` objects with `plain`. The
server encodes each event once and sends the same text to every client and the recorder.
What these build decodes, with `pdtop.telemetry.decode.decode_event`, into the classes of
`pdtop.telemetry.events`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from typing import Any

from pdtop import __version__
from pdtop.engine.description import WIRE
from pdtop.engine.records import ConfigChange, KvTransfer, PrefillProgress, RequestRecord, RoundRecord
from pdtop.telemetry.events import PROTOCOL_VERSION, EngineConfig, EngineDescription

_dumps: Callable[[Any], bytes] | None
try:  # the stream's fast path; without it (the lent GPU machine) records take `encode`'s, and the CLI imports
    import orjson

    _dumps = orjson.dumps
except ImportError:
    _dumps = None

_PREFILL_FIELDS = tuple(f.name for f in dataclasses.fields(PrefillProgress))


def _event(type_: str, **body: Any) -> dict[str, Any]:
    return {"type": type_, "v": PROTOCOL_VERSION, **body}


def round_event(rec: RoundRecord) -> dict[str, Any]:
    """`dataclasses.asdict` with the type, done by hand: asdict deep-copies and is slow per round."""
    body = dict(vars(rec))
    body["prefills"] = [{name: _copy(getattr(p, name)) for name in _PREFILL_FIELDS} for p in rec.prefills]
    if rec.disagg is not None:
        body["disagg"] = dataclasses.asdict(rec.disagg)
    return {"type": "round", "v": PROTOCOL_VERSION, **body}


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def request_event(rec: RequestRecord) -> dict[str, Any]:
    body = dict(vars(rec))
    body["itls_s"] = list(rec.itls_s)
    return {"type": "request", "v": PROTOCOL_VERSION, **body}


def transfer_event(rec: KvTransfer) -> dict[str, Any]:
    return {"type": "transfer", "v": PROTOCOL_VERSION, **vars(rec)}


def config_event(change: ConfigChange, config: EngineConfig) -> dict[str, Any]:
    """`config` is the whole configuration after the change (`Engine.config_record()`)."""
    return _event("config", **dataclasses.asdict(change), config=plain(config))


def plain(value: Any) -> Any:
    """A record (`pdtop.engine.description`) as the JSON values of its object: each field a key, in
    field order, tuples as lists; a field with `FLAT` metadata writes its keys into the object itself,
    one with `IF_SET` is left out while None. Inside values typed `Any` (`runtime`, a device's facts)
    lists and dicts are copied and tuples become lists too; anything else is written as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        flat: dict[str, Any] = {}
        for name, wire in _wire_fields(value.__class__):
            v = getattr(value, name)
            if wire == "flat":
                flat = v
            elif not (wire == "if_set" and v is None):
                out[name] = plain(v)
        clash = out.keys() & flat.keys()
        if clash:  # one key, two values
            raise ValueError(f"{value.__class__.__name__}: extra keys named like its fields: {sorted(clash)}")
        out.update({k: plain(v) for k, v in flat.items()})
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@functools.cache
def _wire_fields(cls: type) -> tuple[tuple[str, str | None], ...]:
    return tuple((f.name, f.metadata.get(WIRE)) for f in dataclasses.fields(cls))


_RECORD_HEADS = {cls: f'{{"type":"{name}","v":{PROTOCOL_VERSION},'.encode()
                 for cls, name in ((RoundRecord, "round"), (RequestRecord, "request"), (KvTransfer, "transfer"))}


def encode_record(rec: RoundRecord | RequestRecord | KvTransfer) -> str:
    """The event of a round or request record as JSON text, straight from the dataclass: orjson
    writes it about 12x faster than building the dict and `json.dumps` (9 us a record), which the
    engine thread pays for every event streamed. It parses to `record_event(rec)`, non-finite
    floats as null as `encode` writes them; what orjson cannot write (or no orjson) takes `encode`'s path."""
    if _dumps is None:
        return encode(record_event(rec))
    try:
        body = _dumps(rec)
    except TypeError:
        return encode(record_event(rec))
    return (_RECORD_HEADS[rec.__class__] + body[1:]).decode()


def record_event(rec: Any, config: EngineConfig | None = None) -> dict[str, Any]:
    """Any engine record -> its event. A `ConfigChange` needs the config after the change."""
    if isinstance(rec, RoundRecord):
        return round_event(rec)
    if isinstance(rec, RequestRecord):
        return request_event(rec)
    if isinstance(rec, KvTransfer):
        return transfer_event(rec)
    if isinstance(rec, ConfigChange):
        if config is None:
            raise TypeError("a ConfigChange's event needs the configuration after it")
        return config_event(rec, config)
    raise TypeError(f"not an engine record: {type(rec).__name__}")


def hello_event(client_id: str, readonly: bool, engine: EngineDescription, api: str | None = None) -> dict[str, Any]:
    """`engine` is `Engine.describe()`."""
    return _event("hello", pdtop=__version__, client_id=client_id, readonly=readonly, engine=plain(engine), api=api)


def scrape_hello_event(url: str, engine: str, model_name: str | None, models: list[str], interval_s: float,
                       window_s: float) -> dict[str, Any]:
    """The hello of a scraped `/metrics` page: no engine description, the target in `scrape`."""
    target = {"url": url, "engine": engine, "model_name": model_name, "models": list(models),
              "interval_s": interval_s, "window_s": window_s}
    return _event("hello", pdtop=__version__, client_id="scrape", readonly=True, engine=None, api=None, scrape=target)


def fleet_hello_event(interval_s: float, window_s: float, router: str | None) -> dict[str, Any]:
    """The hello of a fleet of `/metrics` pages: no engine, no single page; `fleet` describes the watch."""
    return _event("hello", pdtop=__version__, client_id="fleet", readonly=True, engine=None, api=None,
                  fleet={"interval_s": interval_s, "window_s": window_s, "router": router})


def fleet_event(time: float, servers: list[dict[str, Any]]) -> dict[str, Any]:
    """Every server's row (`pdtop.telemetry.sources.fleet`)."""
    return _event("fleet", time=time, servers=servers)


def metrics_event(fields: dict[str, Any]) -> dict[str, Any]:
    """One scrape's figures (`pdtop.telemetry.scrape.figures`)."""
    return _event("metrics", **fields)


def hw_event(time: float, metrics: dict[str, Any]) -> dict[str, Any]:
    return _event("hw", time=time, **metrics)


def dropped_event(count: int) -> dict[str, Any]:
    return _event("dropped", count=count)


def reply_event(msg_id: Any, ok: bool, field: str | None = None, reason: str | None = None,
                **extra: Any) -> dict[str, Any]:
    event = _event("reply", id=msg_id, ok=ok, **extra)
    if not ok:
        event["error"] = {"field": field, "reason": reason}
    return event


def error_event(field: str | None, reason: str) -> dict[str, Any]:
    return _event("error", field=field, reason=reason)


def seek_event(position: float, config: EngineConfig | None) -> dict[str, Any]:
    """Replay only: playback moved to `position`; `config` is the configuration in force there (None
    in a recording of a scraped page)."""
    return _event("seek", position=position, config=None if config is None else plain(config))


def encode(event: dict[str, Any]) -> str:
    """Compact JSON; NaN and infinities (not JSON) become null."""
    try:
        return json.dumps(event, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):  # non-finite floats, or a value JSON cannot hold
        return json.dumps(_finite(event), separators=(",", ":"), allow_nan=False, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
