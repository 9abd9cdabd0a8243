"""A request as the scheduler sees it: lengths, tokens and timings.

The executor keeps the model-side state (`handle`: a runner `Sequence` on real
devices); everything the scheduler and metrics need lives here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    max_tokens: int
    arrival: float
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens whose KV is computed (chunked prefill progress)
    finished: bool = False
    finish_reason: str | None = None  # "eos" | "length" | "rejected"
    error: str | None = None  # why a request was rejected
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    handle: Any = None  # executor state

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def context_len(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]
