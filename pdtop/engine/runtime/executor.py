"""Turns scheduler decisions into device `Work`: the real model, or bookkeeping for the simulator.

Both executors price work the same way (`roofline/cost.py`, the seed's roofline terms),
so bytes moved and FLOPs per round are reported for every device, and both count KV
the same way: a `BlockPool` (inside the runner's `KVCache`, or alone for the simulator)
is the one owner of KV reservation. `Work.run` returns the sampled tokens, which the
scheduler appends; on the simulator the tokens are placeholders and requests finish by length.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pdtop.engine.devices.base import Work
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.request import Request
from pdtop.engine.roofline import cost
from pdtop.engine.runtime.block_pool import BlockPool


class Executor(ABC):
    cfg: ModelConfig
    pool: BlockPool  # the one count of KV blocks held and promised
    dtype_bytes: int = 2

    @abstractmethod
    def admit(self, req: Request) -> None:
        """Reserve KV for the prompt and promise room for its max_tokens; KVCapacityError (nothing
        changed) when that does not fit, another EngineError when the request is invalid."""

    @abstractmethod
    def release(self, req: Request) -> None: ...

    def kv_usage(self) -> tuple[int, int]:
        """(used tokens, capacity tokens)."""
        return self.pool.used_tokens, self.pool.capacity_tokens

    def describe(self) -> dict[str, Any]:
        """How the work runs (dtype, KV cache, kernels), for `Engine.describe().runtime`: for people, and a
        plain dict, since what it holds depends on the executor (the runner's adds dtype, CUDA's its graphs)."""
        return {"kv_cache": {"tokens": self.pool.capacity_tokens}}

    @abstractmethod
    def _run_decode(self, reqs: list[Request]) -> list[int]: ...

    @abstractmethod
    def prefill_begin(self, reqs: list[Request]) -> Any: ...

    @abstractmethod
    def _run_prefill(self, state: Any, start: int, end: int) -> None: ...

    @abstractmethod
    def finish_prefill(self, state: Any) -> list[int]:
        """The first tokens, sampled from the logits the last prefill slice made (the final norm and
        LM head run inside that slice, on the prefill side).

        Run by the scheduler thread after the last layers are done, not inside the
        prefill work: on CUDA, sampling syncs, so it must not sit in the launched work.
        """

    @abstractmethod
    def _run_chunk(self, decode: list[Request], req: Request | None, n: int) -> tuple[list[int], int | None]: ...

    # -- work builders (shared) ------------------------------------------------------------
    def decode(self, reqs: list[Request]) -> Work:
        lens = [r.context_len for r in reqs]
        return Work("decode", cost.decode_flops(self.cfg, lens), cost.decode_bytes(self.cfg, lens, self.dtype_bytes),
                    lambda: self._run_decode(reqs))

    def prefill(self, state: Any, reqs: list[Request], start: int, end: int) -> Work:
        """Layers [start, end) of a prefill batch; the last chunk is also charged the LM head."""
        finish = end == self.cfg.num_layers
        layers = end - start
        flops = sum(cost.prefill_layer_flops(self.cfg, r.prompt_len, 0, layers) for r in reqs)
        nbytes = cost.prefill_bytes(self.cfg, sum(r.prompt_len for r in reqs), layers, self.dtype_bytes, head=finish)
        if finish:
            flops += sum(cost.prefill_head_flops(self.cfg, r.prompt_len) for r in reqs)
        return Work("prefill", flops, nbytes, lambda: self._run_prefill(state, start, end))

    def chunk(self, decode: list[Request], req: Request | None, n: int) -> Work:
        """One chunked-prefill step: a decode token for each of `decode` plus `n` prompt tokens of `req`."""
        lens = [r.context_len for r in decode]
        flops = cost.decode_flops(self.cfg, lens) if decode else 0.0
        nbytes = cost.decode_bytes(self.cfg, lens, self.dtype_bytes)
        if req is not None and n:
            flops += cost.prefill_flops(self.cfg, n, req.num_cached)
            nbytes += n * self.cfg.kv_bytes_per_token(self.dtype_bytes)
        return Work("mixed", flops, nbytes, lambda: self._run_chunk(decode, req, n))


class ModelExecutor(Executor):
    """Runs the real model through a `ModelRunner`."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.cfg = runner.config
        self.dtype_bytes = runner.dtype_bytes
        self.pool = runner.kv.pool

    def admit(self, req: Request) -> None:
        self.runner.admit(req)

    def describe(self) -> dict[str, Any]:
        return self.runner.describe()

    def release(self, req: Request) -> None:
        self.runner.free(req)

    def _run_decode(self, reqs: list[Request]) -> list[int]:
        return self.runner.decode(reqs)

    def prefill_begin(self, reqs: list[Request]) -> Any:
        return self.runner.prefill_begin(reqs)

    def _run_prefill(self, state: Any, start: int, end: int) -> None:
        self.runner.prefill_layers(state, start, end)

    def finish_prefill(self, state: Any) -> list[int]:
        return self.runner.prefill_finish(state)

    def _run_chunk(self, decode: list[Request], req: Request | None, n: int) -> tuple[list[int], int | None]:
        return self.runner.chunk_step(decode, req, n)


class SimExecutor(Executor):
    """No weights: the runner's KV bookkeeping on a `BlockPool` and placeholder tokens; time comes
    from the simulated device."""

    PLACEHOLDER = 0

    def __init__(self, cfg: ModelConfig, kv_capacity_tokens: int = 1 << 20, dtype_bytes: int = 2,
                 block_size: int = 16):
        self.cfg = cfg
        self.dtype_bytes = dtype_bytes
        self.pool = BlockPool(kv_capacity_tokens, block_size)

    def admit(self, req: Request) -> None:
        self.pool.admit(req.table, req.prompt_len, req.params.max_tokens, f"request {req.id}")

    def release(self, req: Request) -> None:
        self.pool.release(req.table)

    def _grow(self, reqs: list[Request]) -> None:
        self.pool.reserve_many([(r.table, r.num_cached + 1) for r in reqs], what=f"decode batch of {len(reqs)}")
        for r in reqs:
            r.num_cached += 1

    def _run_decode(self, reqs: list[Request]) -> list[int]:
        self._grow(reqs)
        return [self.PLACEHOLDER] * len(reqs)

    def prefill_begin(self, reqs: list[Request]) -> Any:
        return list(reqs)

    def _run_prefill(self, state: Any, start: int, end: int) -> None:
        return None

    def finish_prefill(self, state: Any) -> list[int]:
        for r in state:
            r.num_cached = r.prompt_len
        return [self.PLACEHOLDER] * len(state)

    def _run_chunk(self, decode: list[Request], req: Request | None, n: int) -> tuple[list[int], int | None]:
        self._grow(decode)
        if req is None or not n:
            return [self.PLACEHOLDER] * len(decode), None
        req.num_cached += n
        return [self.PLACEHOLDER] * len(decode), (self.PLACEHOLDER if req.num_cached >= req.prompt_len else None)
