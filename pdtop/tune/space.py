"""SGLang's pdmux knobs as `pdtop tune`'s search space on a device, for the SGLang that will read the
file: the families of knobs, the key that says when two configurations behave the same, which knobs
need a restart, SGLang's default and the roofline's first guess.

The space is built from the device's split table and the model's layer count: from an engine that
is open (`pdtop tune` on pdtop's own engine), or from a device named but not opened
(`space_for_device`: the servers `tune --launch` starts hold the device).

Families (the `levels` choice), each with `layers_per_round` (`split_forward_token_budget` as layers
a round for a long prompt):
- `rule`: SGLang's automatic levels, `sm_group_num` and `decode_bs_divisor` (not on compute
  capability 10.x/12.x, where SGLang 0.5.23 has no rule);
- `manual`: one division `[prefill, decode, 1]`, prefill in steps of the device's granularity;
- `manual2`: two divisions, the one with more prefill from a batch of 1, the other from `threshold`;
- for newer SGLang only: `overlap` (one division with `overlap_decode_full_sm`), and
  `max_split_forward_layers` in every family.
`sm_group_num` and the SM counts need a new server (green contexts, CUDA graphs); the rest can be
set live on a running one (`Knob.restart`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import arch_constraints
from pdtop.engine.scheduling.pdmux_config import SGLANG_MAIN, SGLANG_RELEASE, PdmuxConfig
from pdtop.engine.scheduling.splits import (
    SplitTable,
    no_rule_line,
    prefill_layers_per_step,
    sglang_has_rule,
    slice_layers,
)

if TYPE_CHECKING:
    from pdtop.bench.policy_bench import Scenario
    from pdtop.engine.model.config import ModelConfig
    from pdtop.engine.roofline.gpu_specs import GpuSpec
    from pdtop.tune.http_workload import DatasetTraffic
    from pdtop.tune.score import Slo

SGLANG_DEFAULT = PdmuxConfig(sm_group_num=8, manual_divisions=[], split_forward_token_budget=65536,
                             decode_bs_divisor=36)  # SGLang's PDMuxConfig defaults
CAPS = (0, 1, 2, 4)  # max_split_forward_layers tried (0: off)
Params = dict[str, Any]  # knob name -> value, and "levels" -> the family's name


def device_default(kind: str) -> PdmuxConfig:
    """SGLang's default knobs with the device's own budget where pdtop has one (4,096 on cpu): the
    configuration `pdtop` runs on that device without a file, and what is written if it is chosen."""
    return SGLANG_DEFAULT.replace(split_forward_token_budget=PdmuxConfig().for_device(kind).token_budget)


@dataclass(frozen=True)
class Knob:
    """One knob: integers `low..high` in steps of `step` (log-spaced when `log`), or `choices`."""

    name: str
    low: int = 0
    high: int = 0
    step: int = 1
    log: bool = False
    choices: tuple[int, ...] = ()
    restart: bool = False  # a new value needs a new server (SM counts, sm_group_num)

    @property
    def count(self) -> int:
        return len(self.choices) if self.choices else (self.high - self.low) // self.step + 1

    def nearest(self, value: int) -> int:
        """The knob's value closest to `value` (a configuration from elsewhere, as a point of the space)."""
        if self.choices:
            return min(self.choices, key=lambda c: abs(c - value))
        return self.low + round((min(self.high, max(self.low, value)) - self.low) / self.step) * self.step


@dataclass(frozen=True)
class Family:
    name: str
    knobs: tuple[Knob, ...]
    make: Callable[[Params], PdmuxConfig]
    params: Callable[[PdmuxConfig], Params | None]  # a configuration of this family as its knobs' values

    @property
    def size(self) -> int:
        return math.prod(k.count for k in self.knobs)


@dataclass
class TuneSpace:
    families: tuple[Family, ...]
    key: Callable[[PdmuxConfig], Hashable]  # same key: same behaviour on the workload, measured once
    sglang: str = SGLANG_RELEASE  # the SGLang whose keys and meaning the configurations have
    notes: list[str] = field(default_factory=list)  # what the space leaves out, and why (one line each)

    def family(self, name: str) -> Family:
        return next(f for f in self.families if f.name == name)

    def config(self, params: Params) -> PdmuxConfig:
        return self.family(params["levels"]).make(params)

    def params(self, config: PdmuxConfig) -> Params | None:
        """`config` as a point of the space (values rounded to the knobs'), or None where no family has it."""
        for fam in self.families:
            found = fam.params(config)
            if found is not None:
                return {"levels": fam.name} | {k.name: k.nearest(found[k.name]) for k in fam.knobs}
        return None

    def knobs(self) -> dict[str, Knob]:
        """Every knob by name (families share `layers_per_round` and the cap)."""
        return {k.name: k for f in self.families for k in f.knobs}

    def restart_params(self, config: PdmuxConfig) -> Params:
        """The family and the knobs of `config` that need a new server to change."""
        params = self.params(config) or {}
        restart = {n for n, k in self.knobs().items() if k.restart}
        return {k: v for k, v in params.items() if k == "levels" or k in restart}

    @property
    def size(self) -> int:
        return sum(f.size for f in self.families)


def restart_key(config: PdmuxConfig) -> Hashable:
    """What a running server cannot change: the SM counts of its levels (`sm_group_num`, or the divisions'
    `prefill_sm`/`decode_sm`, overlapped or not). Two configurations with the same key differ only in
    what can be set live (`decode_bs_divisor`, thresholds, the budget, the layer cap)."""
    if config.manual_divisions:
        return "manual", tuple((p, d) for p, d, _ in config.manual_divisions), config.overlap_decode_full_sm
    return "rule", config.sm_group_num


def pdmux_space(table: SplitTable, sc: Scenario, num_layers: int, sglang: str = SGLANG_RELEASE) -> TuneSpace:
    """SGLang's knobs on the device of `table` for SGLang `sglang`, and the key that says when two
    configurations behave the same: the same split for every decode batch size of the window, and the
    same layers a slice for a long prompt beside decode (the long prompts always arrive while decode
    runs, so a cap below the budget's layers acts as that smaller budget would)."""
    newer = sglang == SGLANG_MAIN
    bs_range = range(sc.decode_bs, sc.decode_bs + sc.long_prompts + 1)
    total = table.units
    layers = Knob("layers_per_round", 1, num_layers)
    shared = (layers, Knob("max_split_forward_layers", choices=CAPS)) if newer else (layers,)
    min_part, step = arch_constraints(table.cc_major) if table.cc_major is not None else (1, 1)
    prefill = Knob("prefill_sm", min_part, min_part + max(0, total - 2 * min_part) // step * step, step, restart=True)
    notes = []

    def sliced(config: PdmuxConfig, v: Params) -> PdmuxConfig:
        return config.replace(split_forward_token_budget=v["layers_per_round"] * sc.long_tokens,
                              max_split_forward_layers=v.get("max_split_forward_layers", 0))

    def common(config: PdmuxConfig) -> Params:
        budget = config.token_budget
        return {"layers_per_round": max(1, budget // sc.long_tokens) if budget > 0 else 1,
                "max_split_forward_layers": config.max_split_forward_layers}

    def rule_params(c: PdmuxConfig) -> Params | None:
        if c.manual_divisions:
            return None
        return {"sm_group_num": c.sm_group_num, "decode_bs_divisor": c.decode_bs_divisor} | common(c)

    def manual_params(c: PdmuxConfig, rows: int, overlap: bool) -> Params | None:
        d = c.manual_divisions
        if len(d) != rows or c.overlap_decode_full_sm != overlap or d[0][2] > 1:
            return None
        if rows == 1:
            return {"prefill_sm": d[0][0]} | common(c)
        return {"prefill_sm": d[0][0], "prefill_sm_2": d[1][0], "threshold": d[1][2]} | common(c)

    def one(v: Params, overlap: bool = False) -> PdmuxConfig:
        p = v["prefill_sm"]
        return sliced(PdmuxConfig(sm_group_num=3, manual_divisions=[[p, total - p, 1]],
                                  overlap_decode_full_sm=overlap), v)

    def two(v: Params) -> PdmuxConfig:
        high, low = max(v["prefill_sm"], v["prefill_sm_2"]), min(v["prefill_sm"], v["prefill_sm_2"])
        rows = [[high, total - high, 1], [low, total - low, v["threshold"]]]
        return sliced(PdmuxConfig(sm_group_num=4, manual_divisions=rows), v)

    families = []
    if table.cc_major is None or sglang_has_rule(table.cc_major):
        most = len(table.rebuilt(PdmuxConfig(sm_group_num=256)).groups)
        divisor = Knob("decode_bs_divisor", 1, max(36, bs_range[-1] * (most - 2) + 1), log=True)
        families.append(Family("rule", (Knob("sm_group_num", 3, most, restart=True), divisor, *shared),
                               lambda v: sliced(PdmuxConfig(sm_group_num=v["sm_group_num"],
                                                            decode_bs_divisor=v["decode_bs_divisor"]), v),
                               rule_params))
    else:
        notes.append(f"{no_rule_line(table.cc_major)}; the search covers manual divisions only")
    families.append(Family("manual", (prefill, *shared), one, lambda c: manual_params(c, 1, False)))
    if prefill.count > 1:
        families.append(Family("manual2", (prefill, dataclasses.replace(prefill, name="prefill_sm_2"),
                                           Knob("threshold", 2, bs_range[-1] + 1), *shared), two,
                               lambda c: manual_params(c, 2, False)))
    if newer and total > 2 * min_part:
        families.append(Family("overlap", (prefill, *shared), lambda v: one(v, overlap=True),
                               lambda c: manual_params(c, 1, True)))

    def key(config: PdmuxConfig) -> tuple[Any, ...]:
        t = table.rebuilt(config)  # ConfigError when a manual split does not fit the device
        splits = tuple(t.groups[t.choose(bs, True, config)] for bs in bs_range)
        budget_layers = prefill_layers_per_step(sc.long_tokens, num_layers, config.token_budget)
        return splits, slice_layers(budget_layers, config.max_split_forward_layers, True)

    return TuneSpace(tuple(families), key, sglang, notes)


def first_guess(space: TuneSpace, spec: GpuSpec, cfg: ModelConfig, sc: Scenario, slo: Slo) -> PdmuxConfig | None:
    """The roofline's guess for the workload: the one division that leaves prefill the most SMs while
    decode's step, for the window's largest decode batch at its context, is within the ITL SLO with a
    3% margin (bandwidth taken by the prefill beside it is not priced), the long prompt in one slice;
    when none is, the one with the most decode SMs."""
    from pdtop.engine.roofline.cost import decode_bytes, decode_time

    fam = next((f for f in space.families if f.name == "manual"), None)
    if fam is None:
        return None
    prefill = fam.knobs[0]
    batch = [sc.decode_prompt + 64] * (sc.decode_bs + sc.long_prompts)
    step = {p: decode_time(spec, decode_bytes(cfg, batch), spec.sms - p)
            for p in range(prefill.low, prefill.high + 1, prefill.step)}
    meeting = [p for p, t in step.items() if t * 1.03 <= slo.itl_s]
    p = max(meeting) if meeting else min(step)
    return fam.make({"prefill_sm": p, "layers_per_round": fam.knobs[1].high, "max_split_forward_layers": 0})


def dataset_space_scenario(sc: Scenario, dataset: DatasetTraffic) -> Scenario:
    """The scenario a dataset's search space is built for: budgets in layers of its longest prompt, and
    decode batches of 1 up to its requests (at most `sc.decode_bs + sc.long_prompts`, the scenario's most)."""
    most = max(1, min(len(dataset.prompts), sc.decode_bs + sc.long_prompts))
    return dataclasses.replace(sc, decode_bs=1, long_prompts=most - 1, long_tokens=dataset.longest_prompt)


@dataclass
class DeviceSpace:
    """What `space_for_device` found: the space, the device kind, and what the first guess needs."""

    space: TuneSpace
    kind: str
    spec: GpuSpec | None  # a GPU pdtop has figures for (sim: devices), else None: no roofline guess
    model: ModelConfig


def space_for_device(device: str, model: str | None, sc: Scenario, sglang: str = SGLANG_RELEASE) -> DeviceSpace:
    """The search space of a device named, not opened (where `tune --launch`'s servers run: its split
    table, the model's layer count); no model is loaded and no GPU memory is taken."""
    from pdtop.engine.build import parse_device
    from pdtop.engine.model.config import synthetic_config

    where = parse_device(device)
    config = PdmuxConfig(manual_divisions=[[1, 1, 1]], sm_group_num=3)  # no rule needed to know the device
    if where.gpu is not None:
        table = SplitTable.for_gpu(where.gpu.sms, where.gpu.cc_major, config)
    elif where.kind == "cpu":
        from pdtop.engine.devices.cpu import usable_cores

        table = SplitTable.for_cpu(len(usable_cores()), config)
    else:  # asked in a child process, so no CUDA context of pdtop's stays beside the servers
        import subprocess
        import sys

        code = ("import json, sys\nfrom pdtop.engine.devices.cuda_setup import cuda_device_info as i\n"
                f"try:\n    print(json.dumps(i({where.index})))\n"
                "except Exception as exc:\n    sys.exit(str(exc))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise DeviceError((proc.stderr.strip().splitlines() or ["cuda device unavailable"])[-1])
        info = json.loads(proc.stdout)
        table = SplitTable.for_gpu(info["sms"], info["major"], config)
    if model and not model.startswith("synthetic:"):
        from pdtop.engine.model.loader import read_config

        cfg = read_config(model)
    elif model or where.gpu is not None:
        cfg = synthetic_config(model or "synthetic:qwen3-8b")
    else:
        from pdtop.engine.model.loader import default_model_path, read_config

        cfg = read_config(default_model_path())
    return DeviceSpace(pdmux_space(table, sc, cfg.num_layers, sglang), where.kind, where.gpu, cfg)
