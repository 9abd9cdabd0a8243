"""What the cuda device needs of the process before it starts: CUDA_DEVICE_MAX_CONNECTIONS set before
CUDA does, why the device cannot start here (in words), and the GPU's facts through torch for a
split table made before the device."""
from __future__ import annotations

import os
from typing import Any

from pdtop.engine.devices.green_ctx import INSTALL_HINT
from pdtop.engine.errors import DeviceError

MAX_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
DEFAULT_MAX_CONNECTIONS = "32"  # the most hardware work queues; CUDA's default is 8
_connections_note: dict[str, Any] = {}


def set_max_connections() -> None:
    """Set CUDA_DEVICE_MAX_CONNECTIONS (unless the user did) before CUDA starts: with CUDA's
    default of 8 work queues, streams of different green contexts share queues and a decode
    launch can wait behind queued prefill kernels. Called by everything that may start CUDA
    for the cuda device; `max_connections_state()` says whether it came in time."""
    if _connections_note:
        return
    user = os.environ.get(MAX_CONNECTIONS_ENV)
    started = False
    try:
        import torch

        started = torch.cuda.is_initialized()
    except ImportError:
        pass
    if user is None:
        os.environ[MAX_CONNECTIONS_ENV] = DEFAULT_MAX_CONNECTIONS
    _connections_note.update(set_by="user" if user is not None else "pdtop", cuda_started_before=started)


def max_connections_state() -> dict[str, Any]:
    """The value CUDA_DEVICE_MAX_CONNECTIONS has, who set it, and whether CUDA had already started
    (then the setting may not apply to this process)."""
    return {"value": os.environ.get(MAX_CONNECTIONS_ENV), **_connections_note}


def cuda_unavailable_reason(index: int = 0) -> str | None:
    """Why the CUDA device cannot start here, on one line, the first problem first: torch (a CPU-only
    build, no GPU visible), then cuda-python; None when nothing is missing."""
    set_max_connections()
    missing: list[str] = []
    try:
        import torch
    except ImportError:
        missing.append("torch is not installed")
    else:
        if torch.version.cuda is None:
            missing.append(f"torch {torch.__version__} is a CPU-only build: install a CUDA build of torch")
        elif not torch.cuda.is_available():
            missing.append(f"torch {torch.__version__} sees no CUDA GPU (no NVIDIA driver or GPU visible)")
        elif not 0 <= index < torch.cuda.device_count():
            missing.append(f"CUDA device index {index} out of range: {torch.cuda.device_count()} GPU(s) visible")
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        try:
            from cuda import cuda as _old  # noqa: F401
        except ImportError:
            missing.append(f"{'then ' if missing else ''}cuda-python is not installed: {INSTALL_HINT}")
    return "; ".join(missing) or None


def cuda_device_info(index: int = 0) -> dict:
    """Name, SM count and compute capability of GPU `index` through torch, for building a split
    table before the device; `DeviceError` (what is missing) where there is no usable GPU."""
    reason = cuda_unavailable_reason(index)
    if reason:
        raise DeviceError(f"cuda device unavailable: {reason}")
    import torch

    p = torch.cuda.get_device_properties(index)
    return {"name": p.name, "sms": p.multi_processor_count, "major": p.major, "minor": p.minor}
