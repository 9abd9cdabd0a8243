"""What the subcommand tests share with the tests of the layer each command drives, taken from where
it is defined (one copy): `until` (run a Pilot until a predicate holds, a fixture) from tests/ui/conftest.py."""
from __future__ import annotations

from ui.conftest import until  # noqa: F401  (tests/ui is a package; pytest imports its conftest by this name)
