"""Parsed JSON -> a typed dataclass, checked once against its type hints (`decode_as`).

The one validation mechanism for what pdtop receives: telemetry events
(`pdtop.telemetry.decode.decode_event` builds on it), and next the control commands and the
pdmux YAML. It is pdtop's own rather than pydantic's because it runs on the engine's and the
dashboard's hot paths (a round costs about 5 µs), adds no dependency to the engine or telemetry
(pydantic stays in the HTTP API, where FastAPI brings it), and says what is wrong in one line
naming the field: `prefills[0].layers_done: expected an integer, got '3'`.

Each field is checked against its class's type hints: integers are integers (not bools),
numbers are finite, lists, pairs and nested objects have their shape (parts typed `Any` are
left as they are). A field may be left out only where null is allowed; fields a class does not
know are ignored (the protocol adds fields without a new version), except where the class keeps
them: a field with `FLAT` metadata (`DeviceDescription.extra`, a device's own facts) collects the
keys its class does not name, unchecked, and one with `ABSENT` metadata records which of the
class's fields the object lacked (so writing it again leaves them out, as it came).

The checker of a class is built once, on its first use; objects and lists (the bulk of a round)
build no field path unless a check fails.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union

from pdtop.engine.description import WIRE

T = TypeVar("T")
Check = Callable[[Any], Any]  # a value -> the typed value, or raises _Invalid


class DecodeError(ValueError):
    """Not a valid value of the class, in one line (`round.prefills[0].layers_done: expected an integer,
    got '3'`). `field` is the path inside the object (`prefills[0].layers_done`; None: the object
    itself), `reason` what is wrong with it: a command's refusal names the same field."""

    def __init__(self, message: str, field: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.field, self.reason = field, message if reason is None else reason


def decode_as(cls: type[T], obj: Any, name: str | None = None) -> T:
    """`obj` (parsed JSON) as an instance of the dataclass `cls`; `DecodeError` naming the field if it
    is not one. `name` starts the error's line (default: the class's name)."""
    check = _object(cls)
    try:
        return check(obj)
    except _Invalid as exc:
        where = "".join(reversed(exc.where))
        raise DecodeError(f"{name or cls.__name__}{where}: {exc.reason}", where.removeprefix(".") or None,
                          exc.reason) from None


class _Invalid(Exception):
    """Raised inside the checkers; each level adds where it was on the way out."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.where: list[str] = []


def _fail(want: str, value: Any) -> typing.NoReturn:
    raise _Invalid(f"expected {want}, got {show(value)}")


def show(value: Any) -> str:
    """A received value as an error message names it: its JSON kind, or a short repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- scalars ----------------------------------------------------------------------------

def _int(v: Any) -> int:
    if v.__class__ is int:
        return v
    _fail("an integer", v)


def _float(v: Any) -> float:
    cls = v.__class__
    if cls is float:
        if math.isfinite(v):
            return v
        raise _Invalid(f"not a finite number: {v}")
    if cls is int:
        return float(v)
    _fail("a number", v)


def _str(v: Any) -> str:
    if v.__class__ is str:
        return v
    _fail("a string", v)


def _bool(v: Any) -> bool:
    if v is True or v is False:
        return v
    _fail("true or false", v)


def _any(v: Any) -> Any:
    """Any JSON value, unchecked: the parts typed `Any` (a batch's events, a change's old and new
    values) are either decoded on their own later or only shown."""
    return v


_SCALARS: dict[Any, tuple[Check, str]] = {
    int: (_int, "an integer"), float: (_float, "a number"), str: (_str, "a string"), bool: (_bool, "true or false"),
}


def _at(check: Check, value: Any, where: str) -> Any:
    try:
        return check(value)
    except _Invalid as exc:
        exc.where.append(where)
        raise


# ---- containers -------------------------------------------------------------------------

def _list(item: Check) -> Check:
    def check(v: Any) -> list[Any]:
        if v.__class__ is not list:
            _fail("a list", v)
        try:
            return [item(x) for x in v]
        except _Invalid:
            for i, x in enumerate(v):  # again, to say which element
                _at(item, x, f"[{i}]")
            raise

    return check


def _tuple(items: list[Check]) -> Check:
    n = len(items)

    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, (list, tuple)) or len(v) != n:
            _fail(f"a list of {n}", v)
        return tuple(_at(c, x, f"[{i}]") for i, (c, x) in enumerate(zip(items, v, strict=True)))

    return check


def _dict(value: Check) -> Check:
    def check(v: Any) -> dict[str, Any]:
        if v.__class__ is not dict:
            _fail("an object", v)
        return {k: _at(value, x, f".{k}") for k, x in v.items()}

    return check


def _nullable(inner: Check) -> Check:
    return lambda v: None if v is None else inner(v)


def _first_of(options: list[tuple[Check, str]]) -> Check:
    want = " or ".join(name for _, name in options)

    def check(v: Any) -> Any:
        for option, _ in options:
            try:
                return option(v)
            except _Invalid:
                pass
        _fail(want, v)

    return check


_CHECKS: dict[type, Check] = {}  # each dataclass's checker, built on its first use


def _object(cls: type) -> Check:
    """The checker building `cls` (a dataclass) from an object with its fields."""
    check = _CHECKS.get(cls)
    if check is None:
        check = _CHECKS[cls] = _build(cls)
    return check


def _build(cls: type) -> Check:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"decode_as takes a dataclass, not {cls!r}")
    hints = typing.get_type_hints(cls)
    kinds = {f.name: f.metadata.get(WIRE) for f in dataclasses.fields(cls)}
    flat = [name for name, kind in kinds.items() if kind == "flat"]
    absent = next((name for name, kind in kinds.items() if kind == "absent"), None)
    fields = [(name, _checker(hints[name]), _allows_none(hints[name])) for name, kind in kinds.items()
              if kind not in ("flat", "absent")]
    named = frozenset(name for name, _, _ in fields)

    def check(v: Any) -> Any:
        if v.__class__ is not dict:
            _fail("an object", v)
        values: dict[str, Any] = {}
        for name in flat:  # at most one: the keys the class does not name
            values[name] = {k: x for k, x in v.items() if k not in named}
        if absent is not None:
            values[absent] = frozenset(name for name in named if name not in v)
        for name, field_check, optional in fields:
            if name not in v:
                if not optional:
                    raise _Invalid(f"missing field {name!r}")
                values[name] = None
                continue
            try:
                values[name] = field_check(v[name])
            except _Invalid as exc:
                exc.where.append(f".{name}")
                raise
        return cls(**values)

    return check


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _checker(tp: Any) -> Check:
    return _named(tp)[0]


def _named(tp: Any) -> tuple[Check, str]:
    """The checker of a type hint, and how an error message names the type."""
    if tp is Any:
        return _any, "any value"
    if tp in _SCALARS:
        return _SCALARS[tp]
    if dataclasses.is_dataclass(tp):
        return _object(tp), "an object"  # type: ignore[arg-type]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [_named(a) for a in args if a is not type(None)]
        check = options[0][0] if len(options) == 1 else _first_of(options)
        name = " or ".join(n for _, n in options)
        return (_nullable(check), name + " or null") if type(None) in args else (check, name)
    if origin is list:
        return _list(_checker(args[0])), "a list"
    if origin is tuple:
        return _tuple([_checker(a) for a in args]), f"a list of {len(args)}"
    if origin is dict and args[0] is str:
        return _dict(_checker(args[1])), "an object"
    raise TypeError(f"no checker for the type {tp!r}")
