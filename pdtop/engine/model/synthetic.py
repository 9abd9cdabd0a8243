"""Models with a named config's shapes and seeded random weights (`synthetic:qwen3-8b`, ...), for timing
and for the simulated device's cost model."""
from __future__ import annotations

from dataclasses import replace

import torch

from pdtop.engine.errors import EngineError, UnsupportedModelError
from pdtop.engine.model.config import ModelConfig, synthetic_config
from pdtop.engine.model.llama import LlamaModel, parse_dtype

_POOL = 1_000_003  # prime


def synthetic_model(name: str, dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
                    num_layers: int | None = None, seed: int = 0) -> LlamaModel:
    """A model with the named config's shapes and seeded random weights (std 0.02, norms 1), the same
    on every device for the same seed (so a GPU's logits can be checked against the CPU's).

    Meant for timing and for the sim device's cost model. An 8B model needs about 16 GB
    in bfloat16 (a GPU) and twice that in float32; on a CPU use `num_layers` to keep it small.
    """
    try:
        cfg = synthetic_config(name)
    except ValueError as e:
        raise UnsupportedModelError(str(e)) from None
    if num_layers is not None:
        if num_layers < 1:
            raise EngineError(f"num_layers must be >= 1, got {num_layers}")
        cfg = replace(cfg, num_layers=num_layers)
    dt, dev = parse_dtype(dtype), torch.device(device)
    _check_memory(cfg, dt, dev)
    gen = torch.Generator().manual_seed(seed)  # on the CPU whatever the device: the same weights everywhere
    h, d, f = cfg.hidden, cfg.head_dim, cfg.ffn
    # One seeded block of uniform noise (std 0.02), tiled into every matrix from a random
    # offset: generating billions of random numbers would take minutes on a small CPU.
    # The block's length is prime, so rows never repeat with the row length.
    pool = torch.empty(_POOL, dtype=torch.float32).uniform_(-0.02 * 3 ** 0.5, 0.02 * 3 ** 0.5,
                                                           generator=gen).to(dev, dt)
    pool = torch.cat((pool, pool))

    def rand(*shape: int) -> torch.Tensor:
        x = torch.empty(*shape, dtype=dt, device=dev)
        flat = x.view(-1)
        start = int(torch.randint(_POOL, (1,), generator=gen))
        for off in range(0, flat.numel(), _POOL):
            n = min(_POOL, flat.numel() - off)
            flat[off:off + n].copy_(pool[start:start + n])
        return x

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dt, device=dev)

    with torch.inference_mode():
        w: dict[str, torch.Tensor] = {"embed": rand(cfg.vocab, h), "norm": ones(h)}
        if not cfg.tie_embeddings:
            w["lm_head"] = rand(cfg.vocab, h)
        for i in range(cfg.num_layers):
            p = f"{i}."
            w[p + "qkv"] = rand((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h)
            w[p + "o"] = rand(h, cfg.num_heads * d)
            w[p + "gate_up"] = rand(2 * f, h)
            w[p + "down"] = rand(h, f)
            w[p + "attn_norm"], w[p + "mlp_norm"] = ones(h), ones(h)
            if cfg.qk_norm:
                w[p + "q_norm"], w[p + "k_norm"] = ones(d), ones(d)
        return LlamaModel(cfg, w, dt, dev)


def _check_memory(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse up front (one line) rather than die of an out-of-memory kill halfway through."""
    params = cfg.linear_params + cfg.vocab * cfg.hidden * (1 if cfg.tie_embeddings else 2)
    need = params * torch.finfo(dtype).bits // 8
    if device.type == "cpu":
        avail = _available_ram()
        if avail is None:
            return
    elif device.type == "cuda" and torch.cuda.is_available():
        avail = torch.cuda.mem_get_info(device)[0]
    else:
        return
    if need > 0.9 * avail:
        raise EngineError(f"{cfg.name} with {cfg.num_layers} layers needs {need / 2**30:.1f} GiB of weights in "
                          f"{str(dtype).removeprefix('torch.')} on {device}, only {avail / 2**30:.1f} GiB free; "
                          "use bfloat16, a GPU, or fewer layers")


def _available_ram() -> int | None:
    """Bytes of RAM available: psutil's figure, else /proc/meminfo's MemAvailable (the lent GPU machine
    may lack psutil), else None (not checked)."""
    try:
        import psutil
    except ImportError:
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
        return kib * 1024
    return int(psutil.virtual_memory().available)
