"""How the driver carves a GPU's SMs for one split level, predicted without a GPU.

SGLang (`sgl_kernel`'s `create_greenctx_stream_by_value`) makes a level `(p, d)` in two
steps, always: carve `p + d` SMs off the device into one green context, then split that
context's SMs into `p` for prefill and the rest for decode (`green_ctx.GreenContexts.split`
does the same). `cuDevSmResourceSplitByCount` gives a group at least `minCount` SMs, rounded
up to the partition limits (`minSmPartitionSize`, `smCoscheduledAlignment` of the resource
split, which CUDA 13 bindings report; the seed's table where they do not), so the prediction
here is only as good as those limits: with 8 and 8 on a 132-SM 9.x GPU, `[60, 40]` would run
as 64 + 40 (104 carved, 64 of them prefill's), but what the driver realizes on a given GPU
is read back from its contexts, and that is what pdtop reports. When `p + d` rounds past the
device (a whole-device level such as 80 + 52 of 132), the prediction is the device itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.roofline.partition import arch_constraints, overlaps

Group = tuple[int, int]


@dataclass(frozen=True)
class PartitionLimits:
    """What a split must respect: parts of at least `min_part` SMs, in multiples of `align`."""

    min_part: int
    align: int
    source: str  # "driver" (CUDA 13 reports them) or "table" (the seed's table by compute capability)

    @classmethod
    def from_table(cls, major: int) -> PartitionLimits:
        min_part, align = arch_constraints(major)
        return cls(min_part, align, "table")

    def as_dict(self) -> dict[str, int | str]:
        return {"min_sms": self.min_part, "align": self.align, "source": self.source}

    def carve(self, count: int) -> int:
        """SMs a group asked for `count` gets: at least `min_part`, rounded up to `align`."""
        count = max(count, self.min_part, 1)
        return -(-count // self.align) * self.align


def why_not(prefill: int, decode: int, total: int, limits: PartitionLimits) -> str:
    """Why `plan_split` refuses a level, in words."""
    if prefill < 1 or decode < 1:
        return "each side needs at least 1 SM"
    if prefill + decode > total:
        return f"it asks for {prefill + decode} SMs of {total}"
    outer = min(limits.carve(prefill + decode), total)
    return (f"prefill's {prefill} SMs round up to {limits.carve(prefill)} of the {outer} carved for the level, "
            f"leaving decode none (parts of at least {limits.min_part} SMs, in steps of {limits.align})")


def plan_split(prefill: int, decode: int, total: int, limits: PartitionLimits,
               inner: PartitionLimits | None = None) -> tuple[int, int] | None:
    """The (prefill, decode) SMs the two-step carve gives a requested level, or None if it cannot.

    Step 1 carves `prefill + decode` rounded up by `limits` (the device's), capped at the device
    (a whole-device level: the driver gives all of it, or makes no group and the device is split
    directly); step 2 gives prefill its count rounded by `inner` (the carved context's limits,
    the device's if not given) out of that, decode the remainder. None when the request does not
    fit or decode would be left with no SM. A prediction: the realized counts come from the
    driver (`GreenContexts.split`).
    """
    if prefill < 1 or decode < 1 or prefill + decode > total:
        return None
    outer = min(limits.carve(prefill + decode), total)
    p = (inner or limits).carve(prefill)
    if p >= outer:
        return None
    return p, outer - p


def plan_level(prefill: int, decode: int, total: int, limits: PartitionLimits) -> tuple[int, int] | None:
    """A level as it runs: a whole-device one as asked, a split one by `plan_split`, an overlapped
    one (`overlap_decode_full_sm`: decode on all `total` SMs) as SGLang makes it: prefill's part of
    a `(prefill, total - prefill)` carve, beside the whole device for decode."""
    if not (prefill and decode):
        return prefill, decode
    if overlaps((prefill, decode), total):
        planned = plan_split(prefill, total - prefill, total, limits) if decode == total else None
        return None if planned is None else (planned[0], total)
    return plan_split(prefill, decode, total, limits)
