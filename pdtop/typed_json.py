"""Parsed JSON -> a typed dataclass, checked once against its type hints (`decode_as`).

The one validation mechanism for what pdtop receives: telemetry events
(`pdtop.telemetry.decode.decode_event` builds on it), control commands (`decode_as(..., closed=True)`,
and `check_fields` for those made in process) and the pdmux YAML (`decode_field`, key by key, as
SGLang reads it). It is pdtop's own rather than pydantic's because it runs on the engine's and the
dashboard's hot paths (a round costs about 5 µs), adds no dependency to the engine or telemetry
(pydantic stays in the HTTP API, where FastAPI brings it), and says what is wrong in one line
naming the field: `prefills[0].layers_done: expected an integer, got '3'`. A value is named by
`show`, never longer than 40 characters, so an error line stays short whatever was received.

Each field is checked against its class's type hints: integers are integers (not bools),
numbers are finite, lists, pairs and nested objects have their shape (parts typed `Any` are
left as they are). A field left out takes its class's default; one without a default may be
left out only where null is allowed (it reads as null). So a field added to a class with a
default reads every older object (a recording made before it) as the class says, the same rule
that lets a reader ignore fields it does not know (the protocol adds fields without a new
version). A default is therefore what a left-out field means (the one writer's convenience,
`Hello.pdtop`, is required by `decode_event`).
Fields a class does not know are ignored, except where the class keeps them: a field with `FLAT`
metadata (`DeviceDescription.extra`, a device's own facts) collects the keys its class does not
name, unchecked, and one with `ABSENT` metadata records which of the class's fields the object
lacked (so writing it again leaves them out, as it came). A closed class (a command) refuses
both a field it does not know and a null where its default is None: a command's field is given
a value or left out.

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


def decode_as(cls: type[T], obj: Any, name: str | None = None, *, closed: bool = False) -> T:
    """`obj` (parsed JSON) as an instance of the dataclass `cls`; `DecodeError` naming the field if it
    is not one. `name` starts the error's line (default: the class's name). `closed`: `obj` may
    hold only `cls`'s fields, and no null where a field's default is None (module doc)."""
    check = _closed(cls) if closed else _object(cls)
    try:
        return check(obj)
    except _Invalid as exc:
        raise _error(name or cls.__name__, exc) from None


def decode_field(cls: type, field: str, value: Any) -> Any:
    """`value` checked as `cls`'s field `field` is checked by `decode_as` (and normalized: an int as
    a float where the field is a number); `DecodeError` naming the field otherwise. For a source read
    key by key (the pdmux YAML), where one bad key is handled on its own."""
    try:
        return _fields(cls)[field](value)
    except _Invalid as exc:
        exc.where.append(f".{field}")
        raise _error(cls.__name__, exc) from None


def check_fields(obj: Any) -> None:
    """Check the fields of a dataclass instance made in process as `decode_as` checks a received
    object's, normalizing them in place (a frozen one too): what a class's `__post_init__` calls so
    that one made in process is as well-formed as one decoded. `DecodeError` naming the field."""
    for name, check in _fields(obj.__class__).items():
        value = getattr(obj, name)
        try:
            checked = check(value)
        except _Invalid as exc:
            exc.where.append(f".{name}")
            raise _error(obj.__class__.__name__, exc) from None
        if checked is not value:
            object.__setattr__(obj, name, checked)


def _error(name: str, exc: _Invalid) -> DecodeError:
    where = "".join(reversed(exc.where))
    return DecodeError(f"{name}{where}: {exc.reason}", where.removeprefix(".") or None, exc.reason)


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


def show_key(key: Any) -> str:
    """A received key as an error message names it: as it is when a short printable string, else as
    `show` names a value (quoted, escapes made visible, shortened)."""
    return key if key.__class__ is str and len(key) <= 40 and key.isprintable() else show(key)


def _at_key(exc: _Invalid, key: Any) -> _Invalid:
    exc.where.append(f".{show_key(key)}")
    return exc


def _at(check: Check, value: Any, where: str) -> Any:
    try:
        return check(value)
    except _Invalid as exc:
        exc.where.append(where)
        raise


# ---- containers -------------------------------------------------------------------------

def _list(item: Check) -> Check:
    def check(v: Any) -> list[Any]:
        if v.__class__ is not list and v.__class__ is not tuple:  # a tuple: a list made in process
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


_CHECKS: dict[tuple[type, bool], Check] = {}  # each dataclass's checker (open, closed), built on its first use
_FIELD_CHECKS: dict[type, dict[str, Check]] = {}


def _object(cls: type) -> Check:
    """The checker building `cls` (a dataclass) from an object with its fields."""
    check = _CHECKS.get((cls, False))
    if check is None:
        check = _CHECKS[cls, False] = _build(cls, closed=False)
    return check


def _closed(cls: type) -> Check:
    check = _CHECKS.get((cls, True))
    if check is None:
        check = _CHECKS[cls, True] = _build(cls, closed=True)
    return check


def _fields(cls: type) -> dict[str, Check]:
    """The checker of each of `cls`'s fields that is a key of its own (not `FLAT` or `ABSENT`)."""
    checks = _FIELD_CHECKS.get(cls)
    if checks is None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"decode_as takes a dataclass, not {cls!r}")
        hints = typing.get_type_hints(cls)
        checks = _FIELD_CHECKS[cls] = {f.name: _checker(hints[f.name]) for f in dataclasses.fields(cls)
                                       if f.metadata.get(WIRE) not in ("flat", "absent")}
    return checks


def _left_out(f: dataclasses.Field[Any], nullable: bool) -> Callable[[], Any]:
    """What a field left out of the object reads as: its default, else null where null is allowed."""
    if f.default is not dataclasses.MISSING:
        default = f.default
        return lambda: default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    if nullable:
        return lambda: None

    def missing() -> Any:
        raise _Invalid("missing")

    return missing


def _build(cls: type, closed: bool) -> Check:
    hints = typing.get_type_hints(cls)
    checks = _fields(cls)
    kinds = {f.name: f.metadata.get(WIRE) for f in dataclasses.fields(cls)}
    flat = [name for name, kind in kinds.items() if kind == "flat"]
    absent = next((name for name, kind in kinds.items() if kind == "absent"), None)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name not in checks:
            continue
        field_check = checks[f.name]
        if closed and f.default is None:  # a null is not a value: the field is given or left out
            field_check = _checker(_not_null(hints[f.name]))
        fields.append((f.name, field_check, _left_out(f, _allows_none(hints[f.name]))))
    named = frozenset(checks)
    unknown = f"unknown field; known: {', '.join(checks)}" if checks else "unknown field: it takes none"

    def check(v: Any) -> Any:
        if v.__class__ is not dict:
            if v.__class__ is cls:  # already one (a field of an instance made in process)
                return v
            _fail("an object", v)
        if closed:
            for k in v:
                if k not in named:
                    raise _at_key(_Invalid(unknown), k)
        values: dict[str, Any] = {}
        for name in flat:  # at most one: the keys the class does not name
            values[name] = {k: x for k, x in v.items() if k not in named}
        if absent is not None:
            values[absent] = frozenset(name for name in named if name not in v)
        for name, field_check, left_out in fields:
            try:
                values[name] = field_check(v[name]) if name in v else left_out()
            except _Invalid as exc:
                exc.where.append(f".{name}")
                raise
        return cls(**values)

    return check


def _not_null(tp: Any) -> Any:
    """`tp` without its None (`int | None` -> `int`)."""
    if not _allows_none(tp):
        return tp
    args = tuple(a for a in typing.get_args(tp) if a is not type(None))
    return args[0] if len(args) == 1 else Union[args]  # noqa: UP007 - built from a tuple of types


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
