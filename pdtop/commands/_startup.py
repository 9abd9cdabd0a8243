"""What `pdtop serve` says on stderr while it starts: which device it picked and why, which
model it loads, and when it is ready. `pdtop dashboard` shows these lines while it waits."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pdtop.format import units

if TYPE_CHECKING:
    from pdtop.engine.engine import Engine

PREFIX = "pdtop serve: "
READY = "ready in "  # the last start-up line: `pdtop dashboard` waits for it


def say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def device_choice(device: str) -> str:
    """`no CUDA device (torch is a CPU-only build): using cpu, 2 cores`, `using sim:H100 (simulated), 132 SMs`.
    Raises what `parse_device` raises for a bad name."""
    from pdtop.engine.build import parse_device

    spec = parse_device(device)
    if spec.kind == "sim" and spec.gpu is not None:
        return f"using {device} (a simulated {spec.gpu.name}), {units(spec.gpu.sms, 'SMs')}"
    if spec.kind == "cpu":
        from pdtop.engine.devices.cpu import usable_cores

        where = f"using cpu, {units(len(usable_cores()), 'cores')}"
        return f"no CUDA device ({_no_cuda_reason()}): {where}" if device == "auto" else where
    return f"CUDA device found: using cuda:{spec.index}" if device == "auto" else f"using cuda:{spec.index}"


def _no_cuda_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return "torch is a CPU-only build" if torch.version.cuda is None else "torch sees no GPU"


def model_loading(model: str | None, device: str) -> str:
    """`loading SmolLM2-135M-Instruct.Q4_1.gguf (93 MB)…` or `synthetic model qwen3-8b (no weights)`."""
    if model is None and device.startswith("sim:"):
        model = "synthetic:qwen3-8b"
    if model is not None and model.startswith("synthetic:"):
        return f"synthetic model {model.removeprefix('synthetic:')} (no weights to load)"
    if model is None:
        from pdtop.engine.model.loader import default_model_path

        path = default_model_path()
    else:
        path = Path(model)
    try:
        size = f" ({path.stat().st_size / 1e6:.0f} MB)"
    except OSError:
        size = ""
    return f"loading {path.name}{size}…"


def ready(engine: Engine, started: float) -> str:
    info = engine.describe()
    return f"{READY}{time.monotonic() - started:.1f} s: model {info.model} on {info.device.name}"
