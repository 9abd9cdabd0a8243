"""How pdtop writes a figure for people: one module, so the dashboard's panels, its notices, the live-tuning
table and `pdtop tune`'s report write the same figure the same way (`349 ms` everywhere, not `348.8 ms`
in one place; `16k` tokens, not `15,709` beside `5.6k`). A figure that is not known (None, NaN) is `–`.
"""
from __future__ import annotations

import math

from rich import filesize

MISSING = "–"


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds, 3 significant figures: 0.00912 -> '9.12 ms', 0.3488 -> '349 ms'."""
    if seconds is None or _missing(seconds):
        return MISSING
    value = seconds * 1e3
    if abs(value) >= 100:
        return f"{value:.0f} ms"
    if abs(value) >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def duration(seconds: float | None) -> str:
    """A human duration: '850 ms', '12.3 s', '2m05s'."""
    if seconds is None or _missing(seconds):
        return MISSING
    if seconds < 1:
        return ms(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes}m{sec:02d}s"


def clock(seconds: float | None) -> str:
    """A position on a timeline: 'm:ss.s'."""
    if seconds is None or _missing(seconds):
        return "–:––"
    minutes, sec = divmod(max(0.0, seconds), 60)
    return f"{int(minutes)}:{sec:04.1f}"


def rate_bytes(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal units: '863.0 GB/s', '3.35 TB/s' (peaks are quoted in TB/s)."""
    if bytes_per_s is None or _missing(bytes_per_s):
        return MISSING
    return filesize.decimal(int(bytes_per_s), precision=2 if bytes_per_s >= 1e12 else 1) + "/s"


def count(n: float | None) -> str:
    """Counts, tokens and token rates: 950, 5.6k, 16k, 4.5M."""
    if n is None or _missing(n):
        return MISSING
    if abs(n) >= 1e6:
        return f"{n / 1e6:.1f}M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.0f}k"
    if abs(n) >= 1e3:
        return f"{n / 1e3:.1f}k"
    if isinstance(n, float) and n != int(n):
        return f"{n:.1f}"
    return f"{int(n)}"


def per_s(n: float | None) -> str:
    """Requests a second (goodput, arrival rates): '0.52/s', '12.5/s', '350/s'."""
    if n is None or _missing(n):
        return MISSING
    if abs(n) >= 100:
        return f"{count(n)}/s"
    return f"{n:.1f}/s" if abs(n) >= 10 else f"{n:.2f}/s"


def percent(fraction: float | None) -> str:
    return MISSING if fraction is None or _missing(fraction) else f"{fraction * 100:.0f}%"


def units(n: int, unit_name: str) -> str:
    """A count of a device's units with the right number: 1 core, 2 cores, 1 SM, 132 SMs."""
    singular = unit_name[:-1] if unit_name.endswith("s") else unit_name
    return f"{n} {singular if n == 1 else unit_name}"


def fit(text: str, width: int) -> str:
    """`text` cut to `width` cells with an ellipsis."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"
