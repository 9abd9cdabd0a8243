"""What the subcommand tests share with the tests of the layer each command drives, taken from where
it is defined (one copy of each): `until` (run a Pilot until a predicate holds, a fixture) from
tests/ui/conftest.py, and `Pump` (read a source on its own task) from tests/telemetry/conftest.py,
for `from conftest import Pump` in test_serve_command.py."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ui.conftest import until  # noqa: F401  (tests/ui is a package; pytest imports its conftest by this name)


def _load(path: Path, name: str):
    """A module from a file (tests/telemetry is not a package: its conftest is only ever `conftest`)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Pump = _load(Path(__file__).resolve().parents[1] / "telemetry" / "conftest.py", "telemetry_conftest").Pump
