"""SGLang's pdmux knobs as `pdtop tune`'s search space on a device: the families of grid points, the
key that says when two configurations behave the same, and the reference point, SGLang's default.

The space is built from the device's split table and the model's layer count: from an engine that
is open (`pdtop tune` on pdtop's own engine), or from a device named but not opened
(`space_for_device`: the servers `tune --launch` starts hold the device).
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import arch_constraints
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable, prefill_layers_per_step, slice_layers
from pdtop.tune.search import Axis, Family, SearchSpace

if TYPE_CHECKING:
    from pdtop.bench.policy_bench import Scenario
    from pdtop.tune.http_workload import DatasetTraffic

SGLANG_DEFAULT = PdmuxConfig(sm_group_num=8, manual_divisions=[], split_forward_token_budget=65536,
                             decode_bs_divisor=36)  # SGLang's PDMuxConfig defaults


def device_default(kind: str) -> PdmuxConfig:
    """SGLang's default knobs with the device's own budget where pdtop has one (4,096 on cpu): the
    configuration `pdtop` runs on that device without a file, and what is written if it is chosen."""
    return SGLANG_DEFAULT.replace(split_forward_token_budget=PdmuxConfig().for_device(kind).token_budget)


def pdmux_space(table: SplitTable, sc: Scenario, num_layers: int) -> SearchSpace:
    """SGLang's knobs on the device of `table`, and the key that says when two behave the same.

    - auto: `sm_group_num` (3 .. every split level the device's rule has), `decode_bs_divisor` (the
      values where the level chosen for the window's decode batch sizes changes, and 36);
    - manual: one division `[prefill, decode, 1]` (used whenever both sides run), prefill units in
      steps of the device's granularity;
    - overlap: the same division with `overlap_decode_full_sm` (decode on the whole device beside it);
    - all: `split_forward_token_budget` as layers per round for a long prompt (1 .. all layers), and
      `max_split_forward_layers` (0: off, 1, 2, 4). The long prompts arrive while decode runs, so a
      cap below the budget's layers behaves as that smaller budget would: the key says so.
    """
    bs_range = range(sc.decode_bs, sc.decode_bs + sc.long_prompts + 1)
    total, budgets = table.units, Axis("layers_per_round", tuple(range(1, num_layers + 1)))
    caps = Axis("max_split_forward_layers", (0, 1, 2, 4))
    most = len(table.rebuilt(PdmuxConfig(sm_group_num=256)).groups)
    divisors = {36} | {max(1, bs * m // level + e) for m in range(1, most - 1) for bs in bs_range
                       for level in range(1, m + 1) for e in (0, 1)}
    min_part, step = arch_constraints(table.cc_major) if table.cc_major is not None else (1, 1)

    def sliced(config: PdmuxConfig, v: dict[str, int]) -> PdmuxConfig:
        return config.replace(split_forward_token_budget=v["layers_per_round"] * sc.long_tokens,
                              max_split_forward_layers=v["max_split_forward_layers"])

    def auto(v: dict[str, int]) -> PdmuxConfig:
        return sliced(PdmuxConfig(sm_group_num=v["sm_group_num"], decode_bs_divisor=v["decode_bs_divisor"]), v)

    def manual(v: dict[str, int], overlap: bool = False) -> PdmuxConfig:
        p = v["prefill_units"]
        return sliced(PdmuxConfig(sm_group_num=3, manual_divisions=[[p, total - p, 1]],
                                  overlap_decode_full_sm=overlap), v)

    def key(config: PdmuxConfig) -> tuple[Any, ...]:
        t = table.rebuilt(config)  # ConfigError when a manual split does not fit the device
        splits = tuple(t.groups[t.choose(bs, True, config)] for bs in bs_range)
        layers = prefill_layers_per_step(sc.long_tokens, num_layers, config.token_budget)
        return splits, slice_layers(layers, config.max_split_forward_layers, True)

    prefill = Axis("prefill_units", tuple(range(min_part, total - min_part + 1, step)))
    return SearchSpace((
        Family("auto", (Axis("sm_group_num", tuple(range(3, most + 1))),
                        Axis("decode_bs_divisor", tuple(sorted(divisors))), budgets, caps), auto),
        Family("manual", (prefill, budgets, caps), manual),
        Family("overlap", (prefill, budgets, caps), lambda v: manual(v, overlap=True)),
    ), key)


def dataset_space_scenario(sc: Scenario, dataset: DatasetTraffic) -> Scenario:
    """The scenario a dataset's search space is built for: budgets in layers of its longest prompt, and
    decode batches of 1 up to its requests (at most `sc.decode_bs + sc.long_prompts`, the scenario's most)."""
    most = max(1, min(len(dataset.prompts), sc.decode_bs + sc.long_prompts))
    return dataclasses.replace(sc, decode_bs=1, long_prompts=most - 1, long_tokens=dataset.longest_prompt)


def space_for_device(device: str, model: str | None, sc: Scenario) -> tuple[SearchSpace, str]:
    """The search space of a device named, not opened (where `tune --launch`'s servers run: its split
    table, the model's layer count), and the device kind; no model is loaded and no GPU memory is taken."""
    from pdtop.engine.build import parse_device
    from pdtop.engine.model.config import synthetic_config
    from pdtop.engine.scheduling.splits import SplitTable

    where = parse_device(device)
    config = PdmuxConfig()
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

        layers = read_config(model).num_layers
    elif model or where.gpu is not None:
        layers = synthetic_config(model or "synthetic:qwen3-8b").num_layers
    else:
        from pdtop.engine.model.loader import default_model_path, read_config

        layers = read_config(default_model_path()).num_layers
    return pdmux_space(table, sc, layers), where.kind
