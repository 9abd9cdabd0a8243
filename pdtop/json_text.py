"""Compact JSON text of any value, never failing: NaN and infinities (not JSON) as null, and what JSON cannot
hold as its `str`. The one writer behind the telemetry wire's `encode` and the commands' `--json`."""
from __future__ import annotations

import json
import math


def json_text(value: object) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):  # non-finite floats, or a value JSON cannot hold
        return json.dumps(finite(value), separators=(",", ":"), allow_nan=False, default=str)


def finite(value: object) -> object:
    """`value` with every non-finite float in it as None, and dict keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
