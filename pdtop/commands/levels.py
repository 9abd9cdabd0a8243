"""Print the split levels (SGLang's stream groups) of a device, and which level runs when.

A level is (prefill units, decode units). Level 0 gives the whole device to prefill, the
last level the whole device to decode; in between are the split levels, prefill-heaviest
first. GPU splits follow SGLang's divide_sm: prefill at least half, decode at least 16 SMs,
counts in steps of the green-context granularity (2 SMs on 7.x/8.x, 8 SMs on 9.0+).
On the CPU device cores play SMs (steps of 1, decode at least 1 core). With a prefill
running, the level is decode_bs * (n-2) // decode_bs_divisor clamped to the split levels,
or the last manual division whose threshold <= decode_bs. On a GPU each level is also shown
as it runs ("realized"): carved as SGLang does (p + d SMs, then p of them), with counts
rounded up to the partition limits; --device cuda asks the driver, the others predict it
from the seed's table (a prediction: the driver's own limits may differ). Examples:
  pdtop levels --gpu H20;  pdtop levels --sms 132 --cc 9.0 --json;  pdtop levels --device cpu
"""
from __future__ import annotations

import argparse
import json
import os

from pdtop.commands.common import fail

SAMPLE_BS = (1, 6, 12, 18, 24, 30, 36, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--sms", metavar="N", help="SM count of the GPU (with --cc)")
    parser.add_argument("--cc", metavar="X.Y", help="compute capability of the GPU, e.g. 9.0 (with --sms)")
    parser.add_argument("--gpu", metavar="NAME",
                        help="a known GPU (H100, H200, A100, H20) or custom:sms=..,cc=..,bw=..,flops=..")
    parser.add_argument("--device", metavar="DEV",
                        help="cpu (this machine's cores), cuda (the current GPU, needs torch with CUDA), or sim:NAME")
    parser.add_argument("--sm-group-num", metavar="K",
                        help="levels in all, including the two whole-device ones (default 8)")
    parser.add_argument("--config", metavar="FILE",
                        help="SGLang pdmux YAML (sm_group_num, manual_divisions, decode_bs_divisor, "
                             "overlap_decode_full_sm, ...)")
    parser.add_argument("--json", action="store_true", help="print the levels as one JSON object")
    parser.epilog = "With no device option, the levels of an H100 (132 SMs, 9.0) are shown."


def _resolve(args: argparse.Namespace) -> tuple[str, int, int | None, int]:
    """(device name, units, cc major or None for the CPU, cc minor)."""
    from pdtop.engine.build import parse_device
    from pdtop.engine.devices.cuda_setup import cuda_device_info
    from pdtop.engine.roofline.gpu_specs import parse_cc, parse_gpu

    chosen = [o for o, v in (("--sms/--cc", args.sms or args.cc), ("--gpu", args.gpu), ("--device", args.device)) if v]
    if len(chosen) > 1:
        raise ValueError(f"give only one of {', '.join(chosen)}")
    if args.sms or args.cc:
        if not (args.sms and args.cc):
            raise ValueError("--sms and --cc go together")
        try:
            sms = int(args.sms)
        except ValueError:
            raise ValueError(f"--sms: expected an integer, got {args.sms!r}") from None
        if sms < 1:
            raise ValueError(f"--sms: expected an integer >= 1, got {sms}")
        major, minor = parse_cc(args.cc)
        return "GPU", sms, major, minor
    where = parse_device(args.device) if args.device else None
    if where is not None and where.kind == "cpu":
        return "cpu", len(os.sched_getaffinity(0)), None, 0
    if where is not None and where.kind == "cuda":
        info = cuda_device_info(where.index)
        return info["name"], info["sms"], info["major"], info["minor"]
    spec = where.gpu if where is not None and where.gpu else parse_gpu(args.gpu or "H100")
    return spec.name, spec.sms, spec.cc_major, spec.cc_minor


def _realized(device: str | None, units: int, major: int,
              groups: list[tuple[int, int]]) -> list[tuple[int, int] | None]:
    """Each level as it runs: from the driver's green contexts (--device cuda), else predicted."""
    from pdtop.engine.devices.sm_split import PartitionLimits, plan_level
    from pdtop.engine.roofline.partition import overlaps

    if device and device.startswith("cuda"):
        from pdtop.engine.build import parse_device
        from pdtop.engine.devices.green_ctx import GreenContexts
        from pdtop.engine.errors import DeviceError

        gc = GreenContexts(parse_device(device).index)
        out: list[tuple[int, int] | None] = []
        try:
            for p, d in groups:
                if not (p and d):
                    out.append((p, d))
                    continue
                over = overlaps((p, d), units)  # decode on the whole device beside prefill's green context
                try:
                    pair = gc.split(p, units - p if over else d)
                except DeviceError:
                    out.append(None)
                    continue
                out.append((pair.realized[0], units) if over else pair.realized)
                gc.destroy(pair)
        finally:
            gc.close()
        return out
    limits = PartitionLimits.from_table(major)
    return [plan_level(p, d, units, limits) for p, d in groups]


def run(args: argparse.Namespace) -> int:
    from pdtop.engine.errors import EngineError
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config
    from pdtop.engine.scheduling.splits import SplitTable

    try:
        name, units, major, minor = _resolve(args)
        config = load_pdmux_config(args.config) if args.config else PdmuxConfig()
        if args.sm_group_num is not None:
            try:
                k = int(args.sm_group_num)
            except ValueError:
                raise ValueError(f"--sm-group-num: expected an integer, got {args.sm_group_num!r}") from None
            if config.manual_divisions and k != len(config.manual_divisions) + 2:
                raise ValueError(f"--sm-group-num {k} conflicts with the {len(config.manual_divisions)} "
                                 "manual divisions of --config")
            config = config.replace(sm_group_num=k)
        table = (SplitTable.for_cpu(units, config) if major is None
                 else SplitTable.for_gpu(units, major, config))
        realized = None if major is None else _realized(args.device, units, major, table.groups)
    except (ValueError, EngineError) as exc:  # ValueError: this command's own argument parsing
        return fail("levels", exc)

    groups = [list(g) for g in table.groups]
    if args.json:
        out: dict = {"groups": groups}
        if realized is not None:
            out["realized"] = [list(r) if r else None for r in realized]
        if major is None:
            out["cores"] = units
        else:
            out.update(sms=units, cc=f"{major}.{minor}")
        out.update(sm_group_num=config.sm_group_num, unit_name=table.unit_name, manual=table.manual, device=name)
        print(json.dumps(out))
        return 0

    unit = table.unit_name
    arch = "" if major is None else f", compute capability {major}.{minor}"
    how = "manual divisions" if table.manual else f"sm_group_num {config.sm_group_num}"
    if config.overlap_decode_full_sm:
        how += "; overlap_decode_full_sm: decode on the whole device beside each division's prefill"
    print(f"{name}: {units} {unit}{arch}, {len(groups)} levels ({how})")
    pw, dw = len(f"prefill {unit}"), len(f"decode {unit}")
    print(f"level  prefill {unit}  decode {unit}" + ("  realized" if realized else ""))
    last = len(groups) - 1
    for i, (p, d) in enumerate(groups):
        note = "  whole device to prefill" if i == 0 else "  whole device to decode" if i == last else ""
        if table.manual and 0 < i < last:
            note = f"  from decode bs {table.thresholds[i - 1]}"
        real = ""
        if realized:
            r = realized[i]
            real = f"  {f'{r[0]} + {r[1]}' if r else 'dropped':>8}"
        print(f"{i:5d}  {p:>{pw}}  {d:>{dw}}{real}{note}")
    if realized and realized != table.groups:  # the engine runs the realized levels, dropped ones left out
        table = table.realized(realized)
        groups = [list(g) for g in table.groups]
        last = len(groups) - 1
        print(f"levels as run: {groups}")
    rule = "manual thresholds" if table.manual else f"decode_bs_divisor {config.decode_bs_divisor}"
    print(f"level picked while a prefill runs ({rule}):")
    for bs in SAMPLE_BS:
        level = table.choose(bs, True, config)
        print(f"  decode bs {bs:3d} -> level {level} {tuple(groups[level])}")
    print(f"decode only -> level {last} {tuple(groups[last])}; prefill only -> level 0 {tuple(groups[0])}")
    return 0
