"""A seeded workload: Poisson arrivals, prompt/output length ranges, and long prompts on demand.

Arrival times are on the engine's clock, so the same generator drives a real
device (wall time) and a simulated one (virtual time). Prompts are windows of
real text shipped with the package (`pdtop/data/corpus.txt`), tokenized by the
model's own tokenizer; a simulated device only needs their lengths.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

# Tokens of an injected long prompt when none is given (the `inject` control, the dashboard's
# `i` key): long enough to see prefill interfere with decode, short enough for the CPU device
# and SmolLM2's 8192-token context. `pdtop bench` and `pdtop estimate` use the seed's 8192.
LONG_PROMPT_TOKENS = 2048


@dataclass
class WorkloadSpec:
    rate: float = 2.0  # requests per second (Poisson); 0 stops arrivals
    prompt_tokens: tuple[int, int] = (32, 256)  # uniform range, inclusive
    output_tokens: tuple[int, int] = (32, 128)
    long_prompt_tokens: int = LONG_PROMPT_TOKENS  # default size of an injected prompt
    seed: int = 0
    paused: bool = False


@dataclass
class Arrival:
    time: float
    prompt_tokens: int
    max_tokens: int
    injected: bool = False


@dataclass
class Workload:
    spec: WorkloadSpec
    start: float = 0.0
    _rng: random.Random = field(init=False)
    _next: float = field(init=False)
    _injected: list[Arrival] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.spec.seed)
        self._next = self.start + self._gap()

    def _gap(self) -> float:
        return self._rng.expovariate(self.spec.rate) if self.spec.rate > 0 else float("inf")

    def due(self, now: float) -> list[Arrival]:
        """Arrivals up to `now` (Poisson ones only while not paused), in time order."""
        out, self._injected = self._injected, []
        if self.spec.paused:
            return out
        while self._next <= now:
            out.append(Arrival(self._next, self._rng.randint(*self.spec.prompt_tokens),
                               self._rng.randint(*self.spec.output_tokens)))
            self._next += self._gap()
        return out

    def inject(self, now: float, prompt_tokens: int | None = None, max_tokens: int | None = None) -> None:
        tokens = prompt_tokens or self.spec.long_prompt_tokens
        out = max_tokens or self.spec.output_tokens[1]
        self._injected.append(Arrival(now, tokens, out, injected=True))

    def set_rate(self, rate: float, now: float) -> None:
        self.spec.rate = rate
        self._next = now + self._gap()

    def pause(self) -> None:
        self.spec.paused = True

    def resume(self, now: float) -> None:
        self.spec.paused = False
        self._next = now + self._gap()


def corpus_text() -> str:
    return resources.files("pdtop").joinpath("data/corpus.txt").read_text(encoding="utf-8")


class PromptMaker:
    """Prompt token ids of an exact length: windows of the shipped corpus, wrapping around."""

    def __init__(self, encode: Callable[[str], list[int]] | None, seed: int = 0):
        self._ids = encode(corpus_text()) if encode is not None else [0]
        self._rng = random.Random(seed)

    def make(self, n: int) -> list[int]:
        start = self._rng.randrange(len(self._ids))
        reps = (start + n) // len(self._ids) + 1
        return (self._ids * reps)[start:start + n]
