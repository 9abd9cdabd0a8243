"""Reading a YAML file pdtop is given (`--config`, themes, tune's `--workload`) as plain, bounded data.

PyYAML's safe loader shares an alias's value, so a few hundred bytes of nested aliases (the
"billion laughs") make a value that anything walking it, an error message's `repr` or a check of
each item, expands to billions of items: a 382-byte `--config` took 28.7 s and 1.76 GB and printed
350 MB (issue 38). The files pdtop reads need no anchors (SGLang's pdmux files have none; themes
and workloads are flat mappings), so an anchor or an alias is refused with its line, as are files
over `MAX_BYTES` and nesting deeper than `MAX_DEPTH` (PyYAML's composer recurses once a level).
What is left is a value no larger than the file. Errors are one line (`YamlError`), never
quoting more than PyYAML's short problem text.
"""
from __future__ import annotations

import functools
import os
from typing import Any

MAX_BYTES = 256 * 1024  # SGLang's pdmux files are under 1 KiB, themes about 1 KiB
MAX_DEPTH = 32  # a pdmux file nests 3 deep (a mapping of a list of lists)


class YamlError(ValueError):
    """Not a YAML file pdtop reads, in one line that says where (`line N`) when it can."""


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The data of the YAML file `path` (None when empty); OSError if it cannot be read, YamlError if it
    is not plain YAML within the bounds (module doc)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlError(f"larger than {MAX_BYTES // 1024} KiB: not a file pdtop reads")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"not UTF-8 text (byte {exc.start})") from None
    return load_yaml(text)


def load_yaml(text: str) -> Any:
    """`text` as YAML data: no anchors or aliases, at most `MAX_DEPTH` deep; YamlError otherwise."""
    import yaml

    loader = None
    try:
        loader = _loader()(text)
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "somewhere"
        problem = _short(exc.problem or exc.context or "unreadable")
        raise YamlError(f"{where}: {problem}" if exc.context == _REFUSED else f"not valid YAML at {where}: {problem}") \
            from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        raise YamlError(f"not valid YAML: {_short(str(exc))}") from None
    finally:
        if loader is not None:
            loader.dispose()


_REFUSED = "refused"  # the context of the composer errors `PlainLoader` raises: valid YAML pdtop does not read


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 120 else line[:117] + "..."


@functools.cache
def _loader() -> type:
    """PyYAML's safe loader, refusing anchors and aliases and nesting past `MAX_DEPTH` as it composes
    (built on first use: importing yaml is not free and most commands read no YAML)."""
    import yaml
    from yaml.composer import ComposerError

    class PlainLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                kind = "an alias (*" if isinstance(event, yaml.AliasEvent) else "an anchor (&"
                raise ComposerError(_REFUSED, None, f"{kind}{_short(anchor)[:40]}): "
                                    "pdtop reads YAML without anchors or aliases, as SGLang's pdmux files, "
                                    "themes and workloads are written", event.start_mark)
            if self.depth >= MAX_DEPTH:
                raise ComposerError(_REFUSED, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return PlainLoader
