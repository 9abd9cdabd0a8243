"""What the plugin reads of SGLang around its scheduler: its version, its ranks, its GPU, its HTTP address.

SGLang 0.5.11 keeps the ranks on the scheduler (`self.tp_rank`, `server_args.dp_size`); 0.5.15 and
later publish them in `sglang.srt.runtime_context` (`get_parallel()`). Both are read here.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

import torch

from pdtop.engine.description import DeviceDescription
from pdtop.sglang_plugin.tap import Placement

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


def sglang_version() -> str:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "?"


def _parallel() -> object | None:
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:  # before 0.5.15
        return None
    return get_parallel()


def _rank(scheduler: Scheduler, parallel: object | None, name: str, default: int | None) -> int | None:
    value = getattr(scheduler, name, None)
    if value is None and parallel is not None:
        try:
            value = getattr(parallel, name)
        except Exception:  # a rank the launcher did not publish
            value = None
    return default if value is None else int(value)


def placement(scheduler: Scheduler) -> Placement:
    parallel = _parallel()
    args = getattr(scheduler, "server_args", None)
    attn_dp = getattr(scheduler, "attn_dp_enabled", None)
    if attn_dp is None:
        attn_dp = getattr(args, "enable_dp_attention", False)
    tp_size = _rank(scheduler, parallel, "tp_size", None)
    if tp_size is None:
        tp_size = int(getattr(args, "tp_size", 1) or 1)
    dp_size = int(getattr(args, "dp_size", 1) or 1)
    dp_rank = _rank(scheduler, parallel, "dp_rank", None)
    return Placement(tp_rank=_rank(scheduler, parallel, "tp_rank", 0) or 0, tp_size=tp_size,
                     dp_rank=dp_rank if dp_size > 1 else None, dp_size=dp_size,
                     pp_rank=_rank(scheduler, parallel, "pp_rank", 0) or 0, attn_dp=bool(attn_dp))


def gpu_id(scheduler: Scheduler) -> int:
    value = getattr(scheduler, "gpu_id", None)
    if value is None:
        try:
            from sglang.srt.runtime_context import get_device
            value = get_device().gpu_id
        except Exception:
            value = None
    return int(value or 0)


def device(scheduler: Scheduler, sm_counts: list[tuple[int, int]] | None) -> DeviceDescription:
    """The GPU as the hello describes it; its SMs from SGLang's own `sm_counts` when pdmux runs."""
    total = sm_counts[0][0] if sm_counts else 0
    extra: dict[str, object] = {}
    name = "no CUDA device in this process"
    if torch.cuda.is_available():
        index = gpu_id(scheduler)
        props = torch.cuda.get_device_properties(index)
        major, minor = torch.cuda.get_device_capability(index)
        name = props.name
        extra = {"gpu": props.name, "sms": props.multi_processor_count, "cc": f"{major}.{minor}", "gpu_id": index}
        uuid = getattr(props, "uuid", None)
        if uuid is not None:  # NVML finds the same GPU by it (the hardware sampler)
            extra["uuid"] = f"GPU-{uuid}"
        bus, domain, dev = (getattr(props, f"pci_{k}_id", None) for k in ("bus", "domain", "device"))
        if isinstance(bus, int) and isinstance(domain, int) and isinstance(dev, int):
            extra["pci_bus_id"] = f"{domain:08x}:{bus:02x}:{dev:02x}.0"
        total = total or props.multi_processor_count
    return DeviceDescription(name=name, kind="cuda", unit_name="SMs", units=total, extra=extra)


def internal_state_url(scheduler: Scheduler) -> tuple[str, str | None] | None:
    """SGLang's `/set_internal_state` on its HTTP server, and the key it wants (its admin key, else its
    API key); None when the scheduler does not say where its server listens."""
    args = getattr(scheduler, "server_args", None)
    host, port = getattr(args, "host", None), getattr(args, "port", None)
    if not host or not port:
        return None
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    key = getattr(args, "admin_api_key", None) or getattr(args, "api_key", None)
    return f"http://{host}:{int(port)}/set_internal_state", key
