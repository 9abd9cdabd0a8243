"""A request, the one type every part of the engine passes around (nano-vllm's `Sequence`).

Who writes what, so that each fact has one owner:
- the scheduler (`scheduling/tokens.py::append_token`) appends tokens and their
  times, moves `status` along and decides when a request is finished;
- the executor (the model runner, or the simulator's bookkeeping) owns the KV side:
  `table` (blocks, through the `BlockPool`), `num_cached`, the sampling `generator` and, when
  asked, `logprobs` (appended as each token is sampled: one per output token).
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
    """How a request's tokens are chosen and when it stops. The fields past `ignore_eos` mean what vLLM
    0.33's `SamplingParams` fields of those names mean; at their defaults they cost nothing (`plain`)."""
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 64
    ignore_eos: bool = False
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1) = all
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one; 0 = off
    repetition_penalty: float = 1.0  # logits of prompt and output tokens: > 0 divided, < 0 multiplied; 1 = off
    min_tokens: int = 0  # no end-of-sequence or stop token (masked) before this many tokens
    stop_token_ids: frozenset[int] = frozenset()  # end the request on these tokens too (finish reason "eos")
    logprobs: bool = False  # record each sampled token's log-probability under the raw logits (`Request.logprobs`)

    def validate(self) -> None:
        """PromptError naming the first bad field (vLLM 0.33's rules)."""
        if not self.temperature >= 0:
            raise PromptError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PromptError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise PromptError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.top_k < -1:
            raise PromptError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise PromptError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise PromptError(f"repetition_penalty must be a finite number greater than zero, got "
                              f"{self.repetition_penalty}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise PromptError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain(self) -> bool:
        """Whether the sampler may take the raw logits as they are (the fast path): no penalty, no
        minimum length, no log-probabilities asked for. top_k and min_p need no work on greedy rows."""
        return self.repetition_penalty == 1.0 and not self.min_tokens and not self.logprobs


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
    logprobs: list[float] = field(default_factory=list, repr=False)  # per output token, if params.logprobs

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
