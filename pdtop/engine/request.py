"""A request, the one type every part of the engine passes around (nano-vllm's `Sequence`).

Who writes what, so that each fact has one owner:
- the scheduler (`scheduling/tokens.py::append_token`) appends tokens and their
  times, moves `status` along and decides when a request is finished;
- the executor (the model runner, or the simulator's bookkeeping) owns the KV side:
  `table` (blocks, through the `BlockPool`), `num_cached` and the sampling `generator`.
`BlockTable`, the request's part of the KV accounting, is defined here, below the runtime
that fills it (`runtime/block_pool.py`). No torch here: the simulator runs without it.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdtop.engine.errors import PromptError

if TYPE_CHECKING:  # the annotation only: the simulator's requests never import torch
    import torch

SOURCES = ("workload", "inject", "api")  # who sent a request (`Request.source`)


@dataclass
class BlockTable:
    """One request's KV blocks, the token slots it has reserved, and the blocks promised to it; only
    a `BlockPool` (`runtime/block_pool.py`) changes it."""
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    promised_blocks: int = 0


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; KV not yet reserved, or reserved but no prefill started
    PREFILLING = "prefilling"  # its prompt is being prefilled (a layer-split batch or chunks)
    DECODING = "decoding"  # has its first token; one more per decode step
    FINISHED = "finished"  # "eos", "length", "stop", "abort" or "rejected": see finish_reason


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 64
    ignore_eos: bool = False

    def validate(self) -> None:
        if not self.temperature >= 0:
            raise PromptError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PromptError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise PromptError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(eq=False)
class Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" | "length" | "stop" | "abort" | "rejected"
    error: str | None = None  # why a request was rejected
    source: str = "workload"  # who sent it: "workload" | "inject" | "api"
    num_cached: int = 0  # tokens whose K/V is in the cache (chunked prefill progress, decode position)
    table: BlockTable = field(default_factory=BlockTable, repr=False)
    generator: torch.Generator | None = field(default=None, repr=False)  # a sampling request's, else None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def context_len(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]
