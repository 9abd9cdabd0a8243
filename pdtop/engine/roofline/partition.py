"""How a GPU's SMs can be partitioned by green contexts: minimum part size and granularity.

Per compute capability major version (the seed's table); 10.x and 12.x behave like 9.x.
"""
from __future__ import annotations

from pdtop.engine.errors import DeviceError

# compute capability major -> (minimum SMs per part, SM granularity); majors >= 9 use 9's.
ARCH: dict[int, tuple[int, int]] = {6: (1, 1), 7: (2, 2), 8: (4, 2), 9: (8, 8)}
MIN_DECODE_SMS = 16  # SGLang never gives decode fewer SMs than this in a split level


def arch_constraints(major: int) -> tuple[int, int]:
    """(minimum SMs per part, granularity) for a compute capability major version.

    Green contexts split in units of 8 SMs from 9.0 on, so 10.x and 12.x behave like 9.x.
    """
    if isinstance(major, bool) or not isinstance(major, int):
        raise DeviceError(f"compute capability major must be an integer, got {major!r}")
    if major < 6:
        raise DeviceError(f"compute capability {major}.x is not supported: green contexts need 6.0 or newer")
    return ARCH[min(major, 9)]


def sm_granularity(major: int) -> int:
    """SMs a green-context part must be a multiple of: 2 on 7.x/8.x, 8 from 9.x on (10.x, 12.x too)."""
    return arch_constraints(major)[1]


def round_sms(count: int, major: int) -> int:
    """`count` rounded up to the split granularity and minimum part size of compute capability `major`."""
    min_part, multiple = arch_constraints(major)
    if count < 1:
        raise ValueError(f"an SM count must be positive, got {count}")
    count = max(count, min_part)
    return -(-count // multiple) * multiple
