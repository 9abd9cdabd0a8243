"""The scheduling policies, named once for the scheduler, live control, the CLI and the dashboard.

What each does is in `scheduler.py`. Cheap to import (the CLI builds its parsers from it).
"""
from __future__ import annotations

from pdtop.engine.errors import ConfigError

POLICIES = ("pdmux", "chunked", "prefill-first", "disagg")
DEFAULT_POLICY = "pdmux"
# why `disagg` does not run on a cuda device, in the words every refusal uses
DISAGG_ON_CUDA = ("the disagg policy runs a prefill instance and a decode instance on devices of their own; "
                  "one GPU cannot hold both: see it with --device sim:H100 --policy disagg (or run it on --device cpu)")


def check_policy(policy: object) -> str:
    """`policy` if it names a policy, else ConfigError."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ConfigError("policy", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy
