"""How work running side by side shares a GPU's memory bandwidth (the simulated GPU's rule).

Green contexts split SMs, not memory bandwidth: decode and prefill running at the same
time read the same HBM. Each side asks for the bandwidth it would use alone (its bytes
over its roofline time on its SMs). When the asks add up to more than the device
achieves (`cost.achieved_bandwidth`: peak * bw_eff), the bandwidth is shared
max-min fairly: a side that asks for less than an equal share gets all of it, and the
others split the rest.
"""
from __future__ import annotations

from collections.abc import Sequence


def share_bandwidth(capacity: float, demands: Sequence[float]) -> list[float]:
    """Max-min fair shares of `capacity` for `demands` (bytes/s each): every grant <= its demand,
    and the grants add up to at most `capacity`."""
    grants = [0.0] * len(demands)
    left = capacity
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for n, i in enumerate(order):
        grants[i] = min(demands[i], left / (len(order) - n))
        left -= grants[i]
    return grants
