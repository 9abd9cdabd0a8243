"""Split levels: how a device is divided between prefill and decode, and which level runs.

The GPU rules are SGLang's PD multiplexing (`srt/multiplex/pdmux_context.py` builds the
levels, `multiplexing_mixin.py::adjust_stream_groups` picks one), written out as in the
seed. A level is a pair `(prefill units, decode units)`; the list of levels ("stream
groups") always starts with the whole device for prefill and ends with the whole device
for decode. The CPU device reuses the rules with cores as units (`cpu_groups`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pdtop.engine.errors import ConfigError, DeviceError
from pdtop.engine.roofline.partition import arch_constraints, stream_groups

if TYPE_CHECKING:
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

Group = tuple[int, int]


def _check_total(total: int, unit: str) -> None:
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise DeviceError(f"the number of {unit} must be a positive integer, got {total!r}")


def choose(groups: Sequence[Group], decode_bs: int, has_prefill: bool, decode_bs_divisor: int = 36) -> int:
    """SGLang's automatic level: more decode requests -> more units to decode.

    With both sides busy: `decode_bs * (n-2) // decode_bs_divisor` clamped to the split
    levels `[1, n-2]`; decode only: the last level; otherwise (prefill only or idle): level 0.
    """
    n = len(groups)
    if decode_bs and has_prefill:
        return max(1, min(n - 2, decode_bs * (n - 2) // decode_bs_divisor))
    return n - 1 if decode_bs else 0


def manual_groups(total: int, manual_divisions: Sequence[Sequence[int]], overlap: bool = False) -> list[Group]:
    """SGLang's levels from `manual_divisions`: whole-to-prefill, each division in order, whole-to-decode.
    With `overlap` (`overlap_decode_full_sm`) a division's decode side is the whole device, as
    SGLang records it: `(prefill_sm, total)`."""
    middle = [(int(p), total if overlap else int(d)) for p, d, _ in manual_divisions]
    return [(total, 0), *middle, (0, total)]


def choose_manual(manual_divisions: Sequence[Sequence[int]], decode_bs: int, has_prefill: bool) -> int:
    """SGLang's level under `manual_divisions` (`[prefill, decode, decode_bs_threshold]` each).

    With both sides busy, the level is `i + 1` for the last division whose threshold is
    `<= decode_bs` (SGLang scans them all without breaking, so thresholds may repeat or go
    down). Below every threshold SGLang 0.5.23 leaves the index unassigned (UnboundLocalError;
    `load_pdmux_config` warns of such a file); pdtop uses level 1. One side idle: the same
    whole-device rule as `choose`.
    """
    n = len(manual_divisions) + 2
    if decode_bs and has_prefill:
        level = 1
        for i, (_, _, threshold) in enumerate(manual_divisions):
            if decode_bs >= threshold:
                level = i + 1
        return level
    return n - 1 if decode_bs else 0


def prefill_layers_per_step(extend_tokens: int, num_layers: int, token_budget: int = 65536) -> int:
    """Layers a split prefill advances per round: `token_budget // extend_tokens`, at least 1, at most all."""
    return min(num_layers, max(1, token_budget // extend_tokens))


def slice_layers(budget_layers: int, max_split_forward_layers: int, decoding: object) -> int:
    """Layers of the next prefill slice (SGLang's `_get_split_forward_count`): the budget's
    `prefill_layers_per_step`, capped at `max_split_forward_layers` (0: no cap) while decode work
    runs beside it (`decoding` truthy: e.g. the decode batch); a prefill alone is never capped."""
    if max_split_forward_layers and decoding:
        return min(budget_layers, max_split_forward_layers)
    return budget_layers


def cpu_groups(cores: int, sm_group_num: int = 8) -> list[Group]:
    """The CPU device's levels: SGLang's rule with cores playing SMs.

    Granularity 1 core, decode at least 1 core, prefill at least half the cores;
    `sm_group_num - 2` split levels taken evenly as `divide_sm` does, plus all cores to
    prefill first and all cores to decode last. 2 cores: `[(2, 0), (1, 1), (0, 2)]`.
    """
    _check_total(cores, "cores")
    cand = [x for x in range(1, cores) if x >= cores - x]
    if not cand:
        raise DeviceError(f"the CPU device needs at least 2 cores to split prefill and decode, got {cores}")
    groups = sm_group_num - 2
    if len(cand) >= groups:
        cand = cand[::max(1, len(cand) // groups)][:groups]
    return [(cores, 0)] + [(x, cores - x) for x in reversed(cand)] + [(0, cores)]


def check_manual_fit(total: int, manual_divisions: Sequence[Sequence[int]], unit: str = "SMs",
                     overlap: bool = False) -> None:
    """SGLang's checks on a manual division (sgl_kernel's create_greenctx_stream_by_value):
    both sides positive and together no more than the device; with `overlap`, prefill strictly
    inside (0, total) and decode_sm ignored (SGLang's `initialize_stream_groups`). Granularity is
    not checked: the driver rounds SM counts up to it (`devices/sm_split.py`), the cuda device
    reports the realized counts and drops a level it cannot make."""
    for i, (p, d, _) in enumerate(manual_divisions):
        if overlap:
            if not 0 < p < total:
                raise ConfigError("manual_divisions", f"entry {i}: overlap_decode_full_sm needs prefill_sm "
                                  f"strictly inside (0, {total}), got {p}: a whole-device cap leaves decode "
                                  f"no {unit} of its own")
            continue
        if p < 1 or d < 1:
            raise ConfigError("manual_divisions", f"entry {i} [{p}, {d}]: each side needs at least 1 {unit[:-1]}")
        if p + d > total:
            raise ConfigError("manual_divisions", f"entry {i} [{p}, {d}] uses {p + d} {unit}, the device has {total}")


def _fit_in_file(config: PdmuxConfig, total: int, unit: str) -> None:
    """`check_manual_fit` of `config`'s divisions, its error naming the file they came from; for a
    file, a warning where newer SGLang is stricter (an exclusive division must use the whole device)."""
    try:
        check_manual_fit(total, config.manual_divisions, unit, config.overlap_decode_full_sm)
    except ConfigError as exc:
        if exc.path is None and config.source:
            raise ConfigError(exc.field, exc.reason, config.source) from None
        raise
    idle = [[p, d] for p, d, _ in config.manual_divisions if p + d < total]
    if config.source and idle and not config.overlap_decode_full_sm:
        from pdtop.engine.scheduling.pdmux_config import SGLANG_MAIN_NAME, SGLANG_RELEASE, warn_once

        warn_once(f"pdmux config {config.source}: manual_divisions: {idle} leave {unit} of the {total} idle: "
                  f"{SGLANG_MAIN_NAME} refuses that (prefill + decode must be the device); SGLang "
                  f"{SGLANG_RELEASE} and pdtop run it")


def sglang_has_rule(major: int) -> bool:
    """Whether SGLang 0.5.23 splits a GPU of compute capability `major` by its rule (`get_arch_constraints`
    knows 6.x to 9.x); elsewhere (10.x, 12.x) it raises "Unsupported compute capability" for the
    automatic split, and only `manual_divisions` start."""
    return major <= 9


def no_rule_line(major: int) -> str:
    from pdtop.engine.scheduling.pdmux_config import SGLANG_RELEASE

    return (f"compute capability {major}.x: SGLang {SGLANG_RELEASE} has no automatic split there (\"Unsupported "
            "compute capability\"): it starts only with manual_divisions")


@dataclass(frozen=True)
class SplitTable:
    """A device's levels and how to pick one; what the scheduler holds.

    `thresholds` are the manual divisions' decode_bs thresholds (empty when automatic).
    Build a new table when `sm_group_num` or `manual_divisions` change; `decode_bs_divisor`
    is read from the config at every `choose`.
    """

    groups: list[Group]
    unit_name: str  # "SMs" | "cores"
    manual: bool = False
    thresholds: tuple[int, ...] = ()
    cc_major: int | None = field(default=None, compare=False)  # None for the CPU

    @property
    def units(self) -> int:
        return self.groups[0][0]

    def choose(self, decode_bs: int, has_prefill: bool, config: PdmuxConfig) -> int:
        if self.manual:
            divisions = [(p, d, t) for (p, d), t in zip(self.groups[1:-1], self.thresholds, strict=True)]
            return choose_manual(divisions, decode_bs, has_prefill)
        return choose(self.groups, decode_bs, has_prefill, config.decode_bs_divisor)

    def realized(self, groups: Sequence[Group | None]) -> SplitTable:
        """This table as a device realized it (`Device.set_groups`): each level's units as they run,
        levels the device dropped (None) left out with their manual threshold."""
        if len(groups) != len(self.groups):
            raise ValueError(f"{len(groups)} realized levels for a table of {len(self.groups)}")
        kept = [(i, g) for i, g in enumerate(groups) if g is not None]
        thresholds = tuple(self.thresholds[i - 1] for i, _ in kept if 0 < i < len(groups) - 1) if self.manual else ()
        return replace(self, groups=[(int(p), int(d)) for _, (p, d) in kept], thresholds=thresholds)

    def rebuilt(self, config: PdmuxConfig) -> SplitTable:
        """The same device's table under another config (as requested; the device realizes it)."""
        if self.cc_major is None:
            return SplitTable.for_cpu(self.units, config)
        return SplitTable.for_gpu(self.units, self.cc_major, config)

    @classmethod
    def for_gpu(cls, total_sms: int, major: int, config: PdmuxConfig) -> SplitTable:
        """Levels for a GPU; manual divisions must fit the device (else ConfigError)."""
        if config.manual_divisions:
            _check_total(total_sms, "SMs")
            arch_constraints(major)
            overlap = config.overlap_decode_full_sm
            _fit_in_file(config, total_sms, "SMs")
            return cls(manual_groups(total_sms, config.manual_divisions, overlap), "SMs", True,
                       tuple(t for _, _, t in config.manual_divisions), major)
        if not sglang_has_rule(major):
            from pdtop.engine.scheduling.pdmux_config import warn_once

            warn_once(f"{no_rule_line(major)}; pdtop splits as on 9.x")
        return cls(stream_groups(total_sms, major, config.sm_group_num), "SMs", False, (), major)

    @classmethod
    def for_cpu(cls, cores: int, config: PdmuxConfig) -> SplitTable:
        """Levels for the CPU device (`cpu_groups`), or the manual divisions counted in cores."""
        if config.manual_divisions:
            _check_total(cores, "cores")
            overlap = config.overlap_decode_full_sm
            _fit_in_file(config, cores, "cores")
            return cls(manual_groups(cores, config.manual_divisions, overlap), "cores", True,
                       tuple(t for _, _, t in config.manual_divisions), None)
        return cls(cpu_groups(cores, config.sm_group_num), "cores", False, (), None)
