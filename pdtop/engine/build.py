"""`build_engine`: a device string and a model name -> a ready `Engine`."""
from __future__ import annotations

from typing import Any

from pdtop.engine.devices.base import Device
from pdtop.engine.engine import Engine
from pdtop.engine.runtime.executor import Executor
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.workload import PromptMaker, Workload


def build_engine(device: str = "auto", model: str | None = None, config: PdmuxConfig | None = None,
                 policy: str = "pdmux", workload: Any = None, seed: int = 0, dtype: str = "float32",
                 kv_capacity_tokens: int | None = None, temperature: float = 0.0,
                 loaded_model: Any = None) -> Engine:
    """An engine on `device` ("auto", "cpu", "cuda", "sim:H100", "sim:custom:..."), ready to `run`.

    `model` is a GGUF path, `synthetic:NAME`, or None (the default model; on `sim:` devices
    `synthetic:qwen3-8b`). `workload` is a `WorkloadSpec`, or None for no arrivals.
    `loaded_model` reuses a model already in memory (tests load it once per session).
    """
    from pdtop.engine.scheduling.workload import WorkloadSpec

    config = config or PdmuxConfig()
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    if device.startswith("sim:"):
        from pdtop.engine.model.config import synthetic_config
        from pdtop.engine.devices.sim import SimDevice
        from pdtop.engine.runtime.executor import SimExecutor
        from pdtop.engine.roofline.gpu_specs import parse_gpu

        spec = parse_gpu(device[4:])
        cfg = _model_config(model) if model and not model.startswith("synthetic:") else synthetic_config(
            model or "synthetic:qwen3-8b")
        table = SplitTable.for_gpu(spec.sms, spec.cc_major, config)
        dev: Device = SimDevice(spec, table.groups)
        executor: Executor = SimExecutor(cfg, kv_capacity_tokens or 1 << 20)
        prompts, name = PromptMaker(None, seed), cfg.name
    elif device in ("cpu", "cuda") or device.startswith("cuda:"):
        from pdtop.engine.runtime.executor import ModelExecutor
        from pdtop.engine.model.loader import default_model_path, load_model
        from pdtop.engine.runtime.runner import ModelRunner, SamplingParams

        if device == "cpu":
            from pdtop.engine.devices.cpu import CpuDevice, usable_cores

            table = SplitTable.for_cpu(len(usable_cores()), config)
            dev = CpuDevice(table.groups)
        else:
            from pdtop.engine.devices.cuda import CudaDevice, cuda_device_info

            index = int(device.split(":")[1]) if ":" in device else 0
            info = cuda_device_info(index)  # DeviceError naming what is missing
            table = SplitTable.for_gpu(info["sms"], info["major"], config)
            dev = CudaDevice(table.groups, index=index)
        source = model or str(default_model_path())
        torch_device = "cpu" if device == "cpu" else f"cuda:{dev.tdev.index}"
        try:
            loaded = loaded_model if loaded_model is not None else load_model(source, dtype=dtype, device=torch_device)
        except BaseException:
            dev.close()
            raise
        runner = ModelRunner(loaded, kv_capacity_tokens or 16384)
        cfg = runner.config
        executor = ModelExecutor(runner, lambda r: SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                                                   seed=r.seed, max_tokens=r.max_tokens,
                                                                   ignore_eos=r.ignore_eos))
        encode = None
        if not source.startswith("synthetic:"):
            from pdtop.engine.model.tokenizer import Tokenizer

            encode = Tokenizer.from_gguf(source).encode
        prompts, name = PromptMaker(encode, seed), cfg.name
    else:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, or sim:GPU (H100, H200, A100, H20, custom:...)")
    wl = Workload(workload, start=dev.now()) if isinstance(workload, WorkloadSpec) else workload
    return Engine(device=dev, executor=executor, table=table, config=config, policy=policy, workload=wl,
                  prompts=prompts, model_name=name, temperature=temperature, seed=seed)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _model_config(path: str) -> Any:
    from pdtop.engine.model.loader import read_config

    return read_config(path)
