"""GPU specifications for the roofline estimate and the simulated GPU device.

`bw_eff` is the share of peak bandwidth decode achieves, `mfu` prefill's share of peak
FLOP/s, and `s_sat` the SM count at which decode saturates bandwidth (fewer SMs scale
it by `sms / s_sat`); the defaults are the seed's assumptions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pdtop.engine.errors import DeviceError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    sms: int
    cc_major: int
    cc_minor: int
    mem_bw: float  # bytes/s, peak
    peak_flops: float  # dense BF16 FLOP/s
    bw_eff: float = 0.85
    mfu: float = 0.5
    s_sat: float = 66
    mem_gib: float | None = None  # memory, GiB (the datasheet's "80GB" is nvidia-smi's 80 GiB); None: unknown

    @property
    def cc(self) -> str:
        return f"{self.cc_major}.{self.cc_minor}"


SPECS: dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", 132, 9, 0, 3.35e12, 989e12, mem_gib=80),  # SXM
    "H200": GpuSpec("H200", 132, 9, 0, 4.8e12, 989e12, mem_gib=141),
    "A100": GpuSpec("A100", 108, 8, 0, 2.039e12, 312e12, mem_gib=80),  # SXM 80GB
    "H20": GpuSpec("H20", 78, 9, 0, 4.0e12, 148e12, mem_gib=96),
}

_CUSTOM_KEYS = ("sms", "cc", "bw", "flops", "bw_eff", "mfu", "s_sat", "mem_gib", "name")
_REQUIRED = ("sms", "cc", "bw", "flops")
CUSTOM_HELP = "custom:sms=132,cc=9.0,bw=3.35e12,flops=989e12[,bw_eff=0.85,mfu=0.5,s_sat=66,mem_gib=80,name=X]"


def parse_cc(text: str) -> tuple[int, int]:
    """'9.0' or '9' -> (9, 0); DeviceError otherwise."""
    major, _, minor = text.strip().partition(".")
    try:
        cc = (int(major), int(minor or 0))
    except ValueError:
        raise DeviceError(f"compute capability must look like 9.0, got {text!r}") from None
    if cc[0] < 0 or cc[1] < 0:
        raise DeviceError(f"compute capability must look like 9.0, got {text!r}")
    return cc


def _positive(key: str, text: str, kind: type) -> float:
    try:
        value = kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
    except ValueError:
        raise DeviceError(f"custom GPU: {key}={text!r} is not a {'whole ' if kind is int else ''}number") from None
    if not (value > 0 and math.isfinite(value)):
        raise DeviceError(f"custom GPU: {key} must be > 0, got {text}")
    return value


def parse_gpu(text: str) -> GpuSpec:
    """A known name (case-insensitive: H100, H200, A100, H20) or a `custom:key=value,...` spec;
    DeviceError naming what is wrong otherwise."""
    text = text.strip()
    if not text.lower().startswith("custom:"):
        for name, spec in SPECS.items():
            if name.lower() == text.lower():
                return spec
        raise DeviceError(f"unknown GPU {text!r}; known: {', '.join(SPECS)}, or {CUSTOM_HELP}")
    fields: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text[len("custom:"):].split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise DeviceError(f"custom GPU: {item!r} must be key=value")
        if key not in _CUSTOM_KEYS:
            raise DeviceError(f"custom GPU: unknown key {key!r}; known: {', '.join(_CUSTOM_KEYS)}")
        fields[key] = value.strip()
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise DeviceError(f"custom GPU: missing {', '.join(missing)} (format: {CUSTOM_HELP})")
    try:
        major, minor = parse_cc(fields["cc"])
    except DeviceError as exc:
        raise DeviceError(f"custom GPU: cc: {exc}") from None
    extra: dict[str, float] = {}
    for key in ("bw_eff", "mfu"):
        if key in fields:
            extra[key] = _positive(key, fields[key], float)
            if extra[key] > 1:
                raise DeviceError(f"custom GPU: {key} is a fraction in (0, 1], got {fields[key]}")
    for key in ("s_sat", "mem_gib"):
        if key in fields:
            extra[key] = _positive(key, fields[key], float)
    return GpuSpec(
        name=fields.get("name", "custom"),
        sms=int(_positive("sms", fields["sms"], int)),
        cc_major=major, cc_minor=minor,
        mem_bw=_positive("bw", fields["bw"], float),
        peak_flops=_positive("flops", fields["flops"], float),
        **extra,
    )
