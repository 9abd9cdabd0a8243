"""What every command shares: the one-line error, the errors that mean bad input, the options of
commands that start an engine on a device, parsers of numeric options, and `--json`'s text.

The commands live in `pdtop/commands/` and, for the features with modules of their own, in
`pdtop/tune/cli.py` and `pdtop/bench/cli.py`; all of them take these from here."""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pdtop.engine.errors import EngineError

if TYPE_CHECKING:
    from pdtop.engine.roofline.kv import Link
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

# Bad input a command reports as one line: the engine's errors, and files it cannot read.
INPUT_ERRORS: tuple[type[BaseException], ...] = (EngineError, OSError)

# --device of the commands that start an engine and its workload (`build.parse_device` reads it).
DEVICE_HELP = "cpu, cuda, or sim:GPU (H100, H200, A100, H20, custom:...); default: cuda if present, else cpu"


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """--dtype, --kv-tokens, --gpu-memory-fraction, --no-cuda-graph and --link (serve, dashboard, bench)."""
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "gguf"),
                        help="weights, activations and KV cache (default: bfloat16 on cuda; on cpu gguf for a file "
                             "whose layer matmul weights are all of these types, else float32); gguf: cpu, matmuls "
                             "on the file's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks, float32 activations "
                             "and KV cache")
    parser.add_argument("--kv-tokens", type=int, metavar="N",
                        help="KV cache capacity in tokens (default: on cuda sized from free GPU memory, "
                             "on cpu 16384); refused up front if it does not fit")
    parser.add_argument("--gpu-memory-fraction", type=float, metavar="F",
                        help="cuda: share of the GPU's memory pdtop may use in all; the KV cache gets what the "
                             "weights and activations leave (default 0.9, as vLLM's --gpu-memory-utilization)")
    parser.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                        help="cuda: launch each decode step kernel by kernel instead of replaying CUDA graphs")
    parser.add_argument("--link", metavar="LINK",
                        help="the disagg policy's KV link: nvlink, rdma400, rdma200, rdma100, pcie5 or a number in "
                             "GB/s (default: rdma400 on sim:, unpaced copies on cpu)")


def runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    """`build_engine` keywords from `add_runtime_arguments`' options (FieldError naming `--link` for a bad link)."""
    return {"dtype": args.dtype, "kv_capacity_tokens": args.kv_tokens,
            "gpu_memory_fraction": args.gpu_memory_fraction, "cuda_graphs": args.cuda_graph,
            "link": engine_link(args.link) if args.link else None}


def engine_link(text: str) -> Link:
    """`--link` of a command that runs an engine: a link (`none` is for `pdtop estimate` only)."""
    from pdtop.engine.errors import FieldError
    from pdtop.engine.roofline.kv import parse_link

    link = parse_link(text, "--link")
    if link is None:
        raise FieldError("--link", "disagg's KV needs a link: name one, or leave --link out for the default")
    return link


def add_level_rule_arguments(parser: argparse.ArgumentParser, slo_flag: bool = True) -> None:
    """--level-rule and --slo-itl-ms (serve, dashboard, bench): pdtop's own keys of the config.
    `slo_flag` False: the command has its own --slo-itl-ms (bench's goodput SLO), which the rule takes."""
    parser.add_argument("--level-rule", choices=("sglang", "slo"),
                        help="how pdmux picks the level: sglang (its rule, linear in the decode batch; default) or "
                             "slo (the fewest decode units a model learned online predicts to meet --slo-itl-ms)")
    if slo_flag:
        parser.add_argument("--slo-itl-ms", type=float, metavar="MS", help="the ITL SLO of --level-rule slo")


def with_level_rule(config: PdmuxConfig, args: argparse.Namespace) -> PdmuxConfig:
    """`config` with the --level-rule / --slo-itl-ms given (ConfigError, one line, if they are wrong)."""
    changes = {k: v for k, v in (("level_rule", getattr(args, "level_rule", None)),
                                 ("slo_itl_ms", getattr(args, "slo_itl_ms", None))) if v is not None}
    return config.replace(**changes) if changes else config


def cuda_missing(device: str | None) -> str | None:
    """For `--device cuda[:N]`, what this machine lacks to run it (one line), before anything starts."""
    if not device or not device.strip().startswith("cuda"):
        return None
    from pdtop.engine.build import parse_device
    from pdtop.engine.devices.cuda_setup import cuda_unavailable_reason

    reason = cuda_unavailable_reason(parse_device(device).index)
    return f"cuda device unavailable: {reason}" if reason else None


def fail(command: str, problem: str | BaseException, code: int = 2) -> int:
    """Print `pdtop COMMAND: error: PROBLEM` (its first line) to stderr and return `code`."""
    text = str(problem).strip().splitlines()
    print(f"pdtop {command}: error: {text[0] if text else type(problem).__name__}", file=sys.stderr)
    return code


N = TypeVar("N", int, float)


def number_list(name: str, text: str, kind: Callable[[str], N]) -> list[N]:
    """Comma-separated positive numbers of `kind` (int or float); ValueError naming the option."""
    what = "integers" if kind is int else "numbers"
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated {what}, got {text!r}") from None
    if not values or any(not 0 < v < math.inf for v in values):
        raise ValueError(f"{name}: expected comma-separated {what} > 0, got {text!r}")
    return values


def positive_number(flag: str, text: str | None, allow_inf: bool = False) -> float | None:
    """A number > 0 (finite unless `allow_inf`), None for None, or ValueError with the flag in its
    one-line message."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and (allow_inf or math.isfinite(value))):
        raise ValueError(f"{flag} must be a positive number, got {text!r}")
    return value


def positive_int(name: str, text: str) -> int:
    """An integer >= 1; ValueError naming the option."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {text!r}")
    return value
