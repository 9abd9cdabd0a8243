"""Turns scheduler decisions into device `Work`: the real model, or bookkeeping for the simulator.

Both executors price work the same way (`cost.py`, the seed's roofline terms), so
bytes moved and FLOPs per round are reported for every device. `Work.run` returns
the sampled tokens; on the simulator the tokens are placeholders and requests
finish by length.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pdtop.engine.roofline import cost
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.devices.base import Work
from pdtop.engine.errors import KVCapacityError
from pdtop.engine.request import Request


class Executor(ABC):
    cfg: ModelConfig
    dtype_bytes: int = 2

    @abstractmethod
    def admit(self, req: Request) -> None:
        """Reserve KV for the prompt; raises KVCapacityError and changes nothing when full."""

    @abstractmethod
    def release(self, req: Request) -> None: ...

    @abstractmethod
    def kv_usage(self) -> tuple[int, int]:
        """(used tokens, capacity tokens)."""

    @abstractmethod
    def _run_decode(self, reqs: list[Request]) -> list[int]: ...

    @abstractmethod
    def prefill_begin(self, reqs: list[Request]) -> Any: ...

    @abstractmethod
    def _run_prefill(self, state: Any, start: int, end: int) -> None: ...

    @abstractmethod
    def finish_prefill(self, state: Any) -> list[int]:
        """Final norm + logits at each prompt's last position and the first tokens.

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
            flops += cost.prefill_flops(self.cfg, n, req.prefilled)
            nbytes += n * self.cfg.kv_bytes_per_token(self.dtype_bytes)
        return Work("mixed", flops, nbytes, lambda: self._run_chunk(decode, req, n))


class ModelExecutor(Executor):
    """Runs the real model through a `ModelRunner`."""

    def __init__(self, runner: Any, params_for: Any):
        self.runner = runner
        self.cfg = runner.config
        self.dtype_bytes = runner.dtype_bytes
        self._params_for = params_for  # Request -> SamplingParams

    def admit(self, req: Request) -> None:
        req.handle = self.runner.add_sequence(req.prompt_ids, self._params_for(req))

    def release(self, req: Request) -> None:
        if req.handle is not None:
            self.runner.free(req.handle)
            req.handle = None

    def kv_usage(self) -> tuple[int, int]:
        return self.runner.kv.used_tokens, self.runner.kv.capacity_tokens

    def _run_decode(self, reqs: list[Request]) -> list[int]:
        return self.runner.decode([r.handle for r in reqs])

    def prefill_begin(self, reqs: list[Request]) -> Any:
        return self.runner.prefill_begin([r.handle for r in reqs])

    def _run_prefill(self, state: Any, start: int, end: int) -> None:
        self.runner.prefill_layers(state, start, end)

    def finish_prefill(self, state: Any) -> list[int]:
        return self.runner.prefill_finish(state)

    def _run_chunk(self, decode: list[Request], req: Request | None, n: int) -> tuple[list[int], int | None]:
        return self.runner.chunk_step([r.handle for r in decode], req.handle if req else None, n)


class SimExecutor(Executor):
    """No weights: KV accounting and placeholder tokens; time comes from the simulated device."""

    PLACEHOLDER = 0

    def __init__(self, cfg: ModelConfig, kv_capacity_tokens: int = 1 << 20, dtype_bytes: int = 2):
        self.cfg = cfg
        self.dtype_bytes = dtype_bytes
        self.capacity = kv_capacity_tokens
        self._admitted: dict[int, Request] = {}

    def admit(self, req: Request) -> None:
        used = self.kv_usage()[0]
        if used + req.prompt_len > self.capacity:
            raise KVCapacityError(f"KV cache full: request {req.id} needs {req.prompt_len} tokens, "
                                  f"{self.capacity - used} of {self.capacity} free")
        self._admitted[req.id] = req

    def release(self, req: Request) -> None:
        self._admitted.pop(req.id, None)

    def kv_usage(self) -> tuple[int, int]:
        return sum(r.context_len for r in self._admitted.values()), self.capacity

    def _run_decode(self, reqs: list[Request]) -> list[int]:
        return [self.PLACEHOLDER] * len(reqs)

    def prefill_begin(self, reqs: list[Request]) -> Any:
        return len(reqs)

    def _run_prefill(self, state: Any, start: int, end: int) -> None:
        return None

    def finish_prefill(self, state: Any) -> list[int]:
        return [self.PLACEHOLDER] * state

    def _run_chunk(self, decode: list[Request], req: Request | None, n: int) -> tuple[list[int], int | None]:
        done = req is not None and req.prefilled + n >= req.prompt_len
        return [self.PLACEHOLDER] * len(decode), (self.PLACEHOLDER if done else None)
