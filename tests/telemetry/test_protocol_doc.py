"""docs/protocol.md's field tables and the event classes say the same, both ways: every
class (and every object nested in one) has a table with exactly its fields and types."""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

from pdtop.engine.description import WIRE
from pdtop.telemetry.events import EVENT_CLASSES

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

# how the type column names a Python type
_WORDS = {int: "int", float: "float", str: "string", bool: "bool", list: "list", dict: "object", Any: "any"}


def _words(tp: Any) -> frozenset[str]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return frozenset().union(*(_words(a) for a in typing.get_args(tp)))
    if tp is type(None):
        return frozenset({"null"})
    if dataclasses.is_dataclass(tp):
        return frozenset({"object"})
    return frozenset({_WORDS[origin or tp]})


def _nested(tp: Any) -> type | None:
    """The dataclass a field holds (itself, in a list, or nullable), if any."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    for arg in typing.get_args(tp):
        found = _nested(arg)
        if found is not None:
            return found
    return None


def classes_as_tables() -> dict[str, dict[str, frozenset[str]]]:
    """`round` -> {field: type words}, `round.prefills` -> ...; a class nested in several
    events (the configuration) is described once, where it first appears. A `FLAT` field
    (a device's own facts) is no key of its own: its keys are the object's others, told in words; nor
    is an `ABSENT` one (which keys an object leaves out)."""
    tables: dict[str, dict[str, frozenset[str]]] = {}
    seen: set[type] = set()

    def walk(path: str, cls: type) -> None:
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        keys = [f for f in dataclasses.fields(cls) if f.metadata.get(WIRE) not in ("flat", "absent")]
        tables[path] = {f.name: _words(hints[f.name]) for f in keys}
        for f in keys:
            inner = _nested(hints[f.name])
            if inner is not None and inner not in seen:
                walk(f"{path}.{f.name}", inner)

    for kind, cls in EVENT_CLASSES.items():
        walk(kind, cls)
    return tables


def doc_tables(text: str) -> dict[str, dict[str, frozenset[str]]]:
    """The `| field | type | meaning |` tables, named by the first `code` in their heading."""
    tables: dict[str, dict[str, frozenset[str]]] = {}
    name = None
    in_fields = False
    for line in text.splitlines():
        heading = re.match(r"#+ .*?`([^`]+)`", line)
        if heading:
            name, in_fields = heading.group(1), False
            continue
        if line.startswith("| field | type |"):
            assert name is not None and name not in tables, f"a second field table under {name!r}"
            tables[name], in_fields = {}, True
            continue
        if not line.startswith("|"):
            in_fields = False
        if in_fields and not line.startswith("| ---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            names = re.findall(r"`([^`]+)`", cells[0])
            kinds = [k.strip() for k in cells[1].split(",")]  # `unit_name`, `units` | string, int
            for i, field in enumerate(names):
                kind = kinds[i] if len(kinds) == len(names) else kinds[0]
                tables[name][field] = frozenset(re.split(r"\s", alt.strip())[0] for alt in kind.split("\\|"))
    return tables


def test_every_event_class_has_its_table_and_every_table_its_class():
    documented, classes = doc_tables(DOC.read_text()), classes_as_tables()
    assert sorted(documented) == sorted(classes)
    for name, fields in classes.items():
        assert documented[name] == fields, name


def test_the_comparison_sees_a_renamed_field_and_a_wrong_type():
    text = DOC.read_text()
    renamed = doc_tables(text.replace("| `decode_step_s` |", "| `decode_step_ms` |"))
    assert "decode_step_ms" in renamed["round"] and renamed["round"] != classes_as_tables()["round"]
    retyped = doc_tables(text.replace("| `tokens_emitted` | int |", "| `tokens_emitted` | float |"))
    assert retyped["round"]["tokens_emitted"] == {"float"}
