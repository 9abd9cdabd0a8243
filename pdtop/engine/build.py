"""`build_engine`: a device string and a model name -> a ready `Engine`; and the one device-string parser."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdtop.engine.devices.base import Device
from pdtop.engine.engine import Engine
from pdtop.engine.errors import DeviceError, EngineError, PromptError
from pdtop.engine.roofline.gpu_specs import CUSTOM_HELP, SPECS, GpuSpec, parse_gpu
from pdtop.engine.roofline.kv import Link
from pdtop.engine.runtime.executor import SimExecutor
from pdtop.engine.scheduling.admission import QueueLimits
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.policies import DEFAULT_POLICY, DISAGG_ON_CUDA
from pdtop.engine.scheduling.splits import SplitTable
from pdtop.engine.scheduling.workload import PromptMaker, Workload, WorkloadSpec

if TYPE_CHECKING:  # imported where they are used: the simulator needs neither torch nor gguf
    from pdtop.engine.model.config import ModelConfig
    from pdtop.engine.model.llama import LlamaModel
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.engine.runtime.kv_sizing import KvPlan
    from pdtop.engine.runtime.runner import ModelRunner

DEVICE_HELP = f"auto, cpu, cuda, cuda:N, or sim:GPU ({', '.join(SPECS)}, {CUSTOM_HELP})"


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string: `kind` is "cpu", "cuda" (GPU `index`) or "sim" (the `gpu` it simulates)."""

    kind: str
    index: int = 0
    gpu: GpuSpec | None = None

    @property
    def torch_device(self) -> str:
        """Where the model's tensors go ("cpu" for the simulator, which has none)."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


def parse_device(text: str) -> DeviceSpec:
    """"auto" (CUDA if torch sees a GPU, else the CPU), "cpu", "cuda", "cuda:N" or "sim:GPU"; DeviceError otherwise."""
    text = text.strip()
    if text == "auto" or text.startswith("cuda"):
        from pdtop.engine.devices.cuda_setup import set_max_connections

        set_max_connections()  # before anything starts CUDA
    if text == "auto":
        return DeviceSpec("cuda" if _cuda_available() else "cpu")
    if text == "cpu":
        return DeviceSpec("cpu")
    if text == "cuda":
        return DeviceSpec("cuda")
    if text.startswith("cuda:"):
        index = text[len("cuda:"):]
        if not index.isdigit():
            raise DeviceError(f"device {text!r}: the GPU index must be a number (cuda:0)")
        return DeviceSpec("cuda", int(index))
    if text.startswith("sim:"):
        return DeviceSpec("sim", gpu=parse_gpu(text[len("sim:"):]))
    raise DeviceError(f"unknown device {text!r}; use {DEVICE_HELP}")


def default_dtype(kind: str, model: str | None = None) -> str:
    """bfloat16 on a GPU (tensor cores; half the bytes of weights and KV). On the CPU `gguf` for a GGUF
    file `model` whose matmul weights are all in types the quantized kernels take (they compute on the
    blocks as stored: a fraction of float32's bytes a step; `loader.blocks_by_default`), else float32
    (files of float weights, synthetic models, no file). Without the kernels a `gguf` load is float32."""
    if kind == "cuda":
        return "bfloat16"
    if kind == "cpu" and model and not model.startswith("synthetic:"):
        from pdtop.engine.model.loader import blocks_by_default

        return "gguf" if blocks_by_default(model) else "float32"
    return "float32"


def check_dtype(kind: str, dtype: str | None) -> None:
    """DeviceError for a `dtype` a sim: device cannot model: it prices bfloat16 weights and KV (its roofline's
    2 bytes an element); gguf's quantized kernels are the CPU's (on cuda the loader says so)."""
    if kind != "sim" or dtype in (None, "bfloat16"):
        return
    if dtype == "gguf":
        raise DeviceError("dtype gguf (compute on the file's quantized blocks) runs on the CPU, not a sim: device")
    raise DeviceError(f"dtype {dtype} runs on cpu or cuda; a sim: device models bfloat16 weights and KV cache")


def check_workload(executor: SimExecutor | ModelRunner, workload: WorkloadSpec) -> None:
    """PromptError when the workload's largest request could never run on `executor` (past the model's
    context, or more KV than the whole cache): every one would be rejected as it arrives."""
    prompt, output = workload.largest_request()
    need, context, pool = prompt + output, executor.cfg.max_context, executor.pool
    what = f"the workload's largest request ({prompt}-token prompt + {output} output tokens)"
    if need > context:
        raise PromptError(f"{what} is longer than the model's context ({context} tokens)")
    if pool.blocks_for(need) > pool.num_blocks:
        raise PromptError(f"the KV cache ({pool.capacity_tokens} tokens) cannot hold {what}: each would be rejected; "
                          f"give --kv-tokens {pool.blocks_for(need) * pool.block_size} or more, or --workload none")


def build_engine(device: str = "auto", model: str | None = None, config: PdmuxConfig | None = None,
                 policy: str = DEFAULT_POLICY, workload: WorkloadSpec | Workload | None = None, seed: int = 0,
                 dtype: str | None = None, kv_capacity_tokens: int | None = None, temperature: float = 0.0,
                 loaded_model: LlamaModel | None = None, gpu_memory_fraction: float | None = None,
                 cuda_graphs: bool = True, limits: QueueLimits | None = None, link: Link | None = None) -> Engine:
    """An engine on `device` (see `parse_device`), ready to `run`.

    `model` is a GGUF path, `synthetic:NAME`, or None (the default model; on `sim:` devices
    `synthetic:qwen3-8b`). `workload` is a `WorkloadSpec`, or None for no arrivals.
    `loaded_model` reuses a model already in memory (tests load it once per session).
    `dtype` defaults by device (`default_dtype`). The KV cache holds `kv_capacity_tokens`, or on
    CUDA what `gpu_memory_fraction` of the GPU leaves beside the weights (`kv_sizing`); the
    chosen size is in `describe().runtime["kv_cache"]`. `limits` caps the waiting queue
    (`QueueLimits`' defaults when None). `link` carries the KV under the `disagg` policy (None:
    rdma400 on `sim:`, unpaced copies on the CPU); disagg on one GPU is refused (DeviceError).
    """
    config = config or PdmuxConfig()
    where = parse_device(device)
    if policy == "disagg" and where.kind == "cuda":
        raise DeviceError(DISAGG_ON_CUDA)
    check_dtype(where.kind, dtype)
    tokenizer: Tokenizer | None = None  # the model file's; synthetic and simulated models have none
    if where.gpu is not None:  # sim:GPU
        from pdtop.engine.devices.sim import SimDevice
        from pdtop.engine.model.config import synthetic_config

        spec = where.gpu
        cfg = _model_config(model) if model and not model.startswith("synthetic:") else synthetic_config(
            model or "synthetic:qwen3-8b")
        table = SplitTable.for_gpu(spec.sms, spec.cc_major, config)
        dev: Device = SimDevice(spec, table.groups)
        executor: SimExecutor | ModelRunner = SimExecutor(cfg, kv_capacity_tokens or 1 << 20)
        prompts, name, path = PromptMaker(None, seed), cfg.name, model or "synthetic:qwen3-8b"
    else:
        from pdtop.engine.runtime.runner import ModelRunner

        cuda_dev = None
        if where.kind == "cpu":
            from pdtop.engine.devices.cpu import CpuDevice, usable_cores

            table = SplitTable.for_cpu(len(usable_cores()), config)
            dev = CpuDevice(table.groups)
        else:
            from pdtop.engine.devices.cuda import CudaDevice
            from pdtop.engine.devices.cuda_setup import cuda_device_info

            info = cuda_device_info(where.index)  # DeviceError naming what is missing
            table = SplitTable.for_gpu(info["sms"], info["major"], config)
            dev = cuda_dev = CudaDevice(table.groups, index=where.index)
        try:
            source = model or _default_model()
            loaded = loaded_model if loaded_model is not None else _load(
                source, dtype or default_dtype(where.kind, source), where.torch_device)
            plan = _kv_plan(where, loaded, kv_capacity_tokens, gpu_memory_fraction, config)
            runner = ModelRunner(loaded, plan.tokens, cuda_graphs=cuda_graphs)
            runner.kv_how = plan.how
            if runner.cuda is not None and cuda_dev is not None:
                cuda_dev.add_streams_listener(runner.cuda.sync_streams)  # graphs on every level's decode stream
            if not source.startswith("synthetic:"):
                from pdtop.engine.model.tokenizer import Tokenizer

                tokenizer = Tokenizer.from_gguf(source)
        except BaseException:
            dev.close()
            raise
        executor = runner
        prompts, name, path = PromptMaker(tokenizer.encode if tokenizer else None, seed), runner.cfg.name, source
    if isinstance(workload, WorkloadSpec):
        try:
            check_workload(executor, workload)
        except PromptError:
            dev.close()
            raise
    wl = Workload(workload, start=dev.now()) if isinstance(workload, WorkloadSpec) else workload
    return Engine(device=dev, executor=executor, table=table, config=config, policy=policy, workload=wl,
                  prompts=prompts, model_name=name, model_path=path, temperature=temperature, seed=seed, limits=limits,
                  tokenizer=tokenizer, link=link)


def _default_model() -> str:
    from pdtop.engine.model.loader import default_model_path

    return str(default_model_path())


def load_for(device: str, model: str | None = None, dtype: str | None = None) -> LlamaModel:
    """The model `build_engine(device, model, dtype=dtype)` would load (the default model, the device's
    default dtype), to pass as `loaded_model` to several engines. Not for `sim:` devices."""
    where, source = parse_device(device), model or _default_model()
    return _load(source, dtype or default_dtype(where.kind, source), where.torch_device)


def _load(source: str, dtype: str, device: str) -> LlamaModel:
    """A synthetic model needs neither gguf nor a file (the GPU check runs where gguf is missing)."""
    if source.startswith("synthetic:"):
        from pdtop.engine.model.synthetic import synthetic_model

        return synthetic_model(source, dtype=dtype, device=device)
    from pdtop.engine.model.loader import load_model

    return load_model(source, dtype=dtype, device=device)


def _kv_plan(where: DeviceSpec, model: LlamaModel, tokens: int | None, fraction: float | None,
             config: PdmuxConfig) -> KvPlan:
    """The KV cache size: `tokens`, else on CUDA sized from free memory, else the CPU default."""
    from pdtop.engine.runtime import kv_sizing

    cfg = model.config
    per_token = cfg.kv_bytes_per_token(model.dtype_bytes)
    if where.kind != "cuda":
        if fraction is not None:
            raise DeviceError("--gpu-memory-fraction applies to cuda devices; use --kv-tokens on the CPU")
        count = kv_sizing.CPU_KV_TOKENS if tokens is None else tokens
        if count < 16:
            raise EngineError(f"--kv-tokens must be at least 16 (one block), got {count}")
        return kv_sizing.KvPlan(count, count * per_token, "as --kv-tokens asked" if tokens else "the CPU default")
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(where.torch_device))
    prefill_tokens = max(8192, config.chunk_size)
    reserve = kv_sizing.activation_reserve(cfg, model.dtype_bytes, prefill_tokens)
    return kv_sizing.plan_kv(per_token, free, total, reserve, fraction=fraction, tokens=tokens)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _model_config(path: str) -> ModelConfig:
    from pdtop.engine.model.loader import read_config

    return read_config(path)
