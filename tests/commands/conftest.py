"""What the subcommand tests share with the tests of the layer each command drives, taken from where
it is defined (one copy of each): `until` (run a Pilot until a predicate holds, a fixture) from
tests/ui/conftest.py, and `Pump` (read a source on its own task) from tests/telemetry/conftest.py,
for `from conftest import Pump` in test_serve_command.py."""
from __future__ import annotations

from telemetry.conftest import Pump  # noqa: F401  (tests/telemetry is a package too)
from ui.conftest import until  # noqa: F401  (tests/ui is a package; pytest imports its conftest by this name)
