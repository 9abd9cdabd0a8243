"""How a GPU's SMs can be partitioned by green contexts: minimum part size and granularity per
compute capability major version (the seed's table; 10.x and 12.x behave like 9.x), and the
levels SGLang asks for by default (`divide_sm`, `stream_groups`: `srt/multiplex/pdmux_context.py`),
used by the split tables and by the cuda device when it is given none.
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


Group = tuple[int, int]


def overlaps(group: Group, total: int) -> bool:
    """Whether a level's two sides share units: decode on the whole device beside a capped prefill
    (SGLang's `overlap_decode_full_sm`), the only level whose `prefill + decode` passes the device."""
    return group[0] + group[1] > total


def divide_sm(total_sms: int, major: int, groups: int) -> list[Group]:
    """Candidate (prefill SMs, decode SMs) splits, prefill-heaviest first.

    Prefill gets at least half, decode at least 16 SMs, counts follow the granularity,
    and `groups` of the candidates are taken evenly (all of them if there are fewer).
    """
    if isinstance(total_sms, bool) or not isinstance(total_sms, int) or total_sms < 1:
        raise DeviceError(f"the number of SMs must be a positive integer, got {total_sms!r}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise DeviceError(f"the number of split groups must be a positive integer, got {groups!r}")
    min_per_part, multiple = arch_constraints(major)
    cand = [x for x in range(min_per_part, total_sms - min_per_part + 1, multiple)
            if x >= total_sms - x and total_sms - x >= MIN_DECODE_SMS]
    if not cand:
        raise DeviceError(
            f"{total_sms} SMs cannot be split at compute capability {major}.x: no split gives prefill "
            f"at least half and decode at least {MIN_DECODE_SMS} SMs in steps of {multiple}")
    if len(cand) >= groups:
        cand = cand[::max(1, len(cand) // groups)][:groups]
    return [(x, total_sms - x) for x in reversed(cand)]


def stream_groups(total_sms: int, major: int, sm_group_num: int = 8) -> list[Group]:
    """Level 0: whole device to prefill; then `sm_group_num - 2` split levels; last: whole device to decode."""
    return [(total_sms, 0), *divide_sm(total_sms, major, sm_group_num - 2), (0, total_sms)]
