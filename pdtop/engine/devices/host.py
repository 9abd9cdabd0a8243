"""The machine a figure was measured on: CPU model, the instruction sets that decide which kernels run
(avx2, avx512f, avx512_bf16, amx), core count and load average. Every benchmark prints `machine_line()`
(bench/*.py, `pdtop bench`), so a figure quoted in the docs names its machine. Reads /proc/cpuinfo;
imports nothing heavy."""
from __future__ import annotations

import os
import platform
from pathlib import Path

FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")  # what oneDNN and csrc/*.c choose paths by


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> dict[str, bool]:
    """Which of `FLAGS` this CPU has (all False where /proc/cpuinfo is not there)."""
    have = set(_cpuinfo().get("flags", "").split())
    return {f: f in have for f in FLAGS}


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def machine() -> dict:
    """`machine_line`'s facts as a dict (for JSON output)."""
    return {"cpu": cpu_model(), "flags": cpu_flags(), "cores": os.cpu_count(),
            "loadavg": [round(x, 2) for x in load_average()]}


def machine_line() -> str:
    """`CPU AMD EPYC; avx2 fma avx512f avx512_vnni avx512_bf16, no amx_tile; 2 cores; load average 0.51 0.40 0.30`."""
    flags = cpu_flags()
    have = " ".join(f for f, on in flags.items() if on) or "none of " + "/".join(FLAGS)
    missing = [f for f, on in flags.items() if not on]
    lacks = f", no {' '.join(missing)}" if missing and len(missing) < len(FLAGS) else ""
    one, five, fifteen = load_average()
    return (f"CPU {cpu_model()}; {have}{lacks}; {os.cpu_count()} cores; "
            f"load average {one:.2f} {five:.2f} {fifteen:.2f}")
