"""A seeded workload: a closed-loop decode batch, long prompts every few seconds, Poisson arrivals,
and long prompts on demand.

- `concurrency`: that many requests are kept in flight; they all arrive at the start, and
  each one that finishes is replaced (at most `concurrency` new ones a second, so a request
  the engine refuses cannot spin).
- `long_every_s`: a `long_prompt_tokens`-token prompt arrives every so many seconds; one
  that falls due while the previous one still waits for its first token is skipped, so a
  slow device never piles them up.
- `rate`: Poisson arrivals on top.

Arrival times are on the engine's clock, so the same generator drives a real device (wall
time) and a simulated one (virtual time). Prompts are windows of real text shipped with the
package (`pdtop/data/corpus.txt`), tokenized by the model's own tokenizer; a simulated
device only needs their lengths. `DEMO` holds the default scenario of each device kind.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources

# Tokens of an injected long prompt when none is given (the `inject` control, the dashboard's
# `i` key): long enough to see prefill interfere with decode, short enough for the CPU device
# and SmolLM2's 8192-token context. `pdtop bench` and `pdtop estimate` use the seed's 8192.
LONG_PROMPT_TOKENS = 2048


@dataclass
class WorkloadSpec:
    rate: float = 2.0  # requests per second (Poisson); 0 stops these arrivals
    prompt_tokens: tuple[int, int] = (32, 256)  # uniform range, inclusive
    output_tokens: tuple[int, int] = (32, 128)
    long_prompt_tokens: int = LONG_PROMPT_TOKENS  # a periodic long prompt, and the default injected one
    seed: int = 0
    paused: bool = False
    concurrency: int = 0  # requests kept in flight (closed loop); 0: none
    long_every_s: float = 0.0  # seconds between long prompts; 0: none

    def describe(self) -> str:
        """One line for people: what arrives, and the seed."""
        def span(r: tuple[int, int]) -> str:
            return f"{r[0]}-{r[1]}" if r[0] != r[1] else str(r[0])

        sizes = f"prompts {span(self.prompt_tokens)}, outputs {span(self.output_tokens)} tokens"
        parts = []
        if self.concurrency:
            parts.append(f"decode batch {self.concurrency} ({sizes})")
        if self.rate:
            parts.append(f"{self.rate:g} req/s Poisson" + ("" if self.concurrency else f" ({sizes})"))
        if self.long_every_s:
            parts.append(f"{self.long_prompt_tokens}-token prompts every {self.long_every_s:g} s")
        return f"{' + '.join(parts) or 'no arrivals'}; seed {self.seed}"


    def largest_request(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) of the largest request it sends: its longest prompt, periodic long
        ones included, with its longest output."""
        longest = max(self.prompt_tokens[1], self.long_prompt_tokens if self.long_every_s else 0)
        return longest, self.output_tokens[1]


# The default scenario per device kind: a steady decode batch, and long prompts arriving while
# it runs, so PD multiplexing shows within seconds of start. On the CPU (SmolLM2-135M on a few
# cores) the batch and prompts are smaller, so a long prompt's prefill takes seconds, not minutes.
DEMO: dict[str, WorkloadSpec] = {
    "sim": WorkloadSpec(rate=0.0, concurrency=48, prompt_tokens=(128, 1024), output_tokens=(256, 1024),
                        long_prompt_tokens=8192, long_every_s=3.0),
    "cuda": WorkloadSpec(rate=0.0, concurrency=48, prompt_tokens=(128, 1024), output_tokens=(256, 1024),
                         long_prompt_tokens=4096, long_every_s=3.0),
    "cpu": WorkloadSpec(rate=0.0, concurrency=8, prompt_tokens=(32, 128), output_tokens=(64, 256),
                        long_prompt_tokens=1024, long_every_s=5.0),
}


def demo_workload(kind: str, rate: float | None = None, seed: int = 0) -> WorkloadSpec:
    """A fresh copy of device kind `kind`'s default scenario, with Poisson `rate` on top if given."""
    return replace(DEMO[kind], rate=DEMO[kind].rate if rate is None else rate, seed=seed)


@dataclass
class Arrival:
    time: float
    prompt_tokens: int
    max_tokens: int
    kind: str = "poisson"  # "poisson" | "loop" (closed loop) | "long" (periodic) | "inject"

    @property
    def injected(self) -> bool:
        return self.kind == "inject"


@dataclass
class Workload:
    spec: WorkloadSpec
    start: float = 0.0
    _rng: random.Random = field(init=False)
    _next: float = field(init=False)
    _loop_next: float = field(init=False)
    _long_next: float = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.spec.seed)
        self._next = self.start + self._gap()
        self._loop_next = self.start - 1.0  # the whole batch may arrive at once at the start
        self._long_next = self.start + self.spec.long_every_s

    def _gap(self) -> float:
        return self._rng.expovariate(self.spec.rate) if self.spec.rate > 0 else float("inf")

    def _arrival(self, time: float, prompt_tokens: int | None = None, kind: str = "poisson") -> Arrival:
        prompt = self._rng.randint(*self.spec.prompt_tokens) if prompt_tokens is None else prompt_tokens
        return Arrival(time, prompt, self._rng.randint(*self.spec.output_tokens), kind)

    def due(self, now: float, in_flight: int = 0, long_waiting: bool = False) -> list[Arrival]:
        """Arrivals up to `now` (none while paused), in time order. `in_flight`: the
        closed loop's requests not finished yet; `long_waiting`: the last periodic long prompt has no
        first token yet."""
        out: list[Arrival] = []
        if self.spec.paused:
            return out
        if self.spec.long_every_s > 0 and self._long_next <= now:
            if not long_waiting:
                out.append(self._arrival(now, self.spec.long_prompt_tokens, "long"))
            while self._long_next <= now:
                self._long_next += self.spec.long_every_s
        if self.spec.concurrency > 0:
            self._loop_next = max(self._loop_next, now - 1.0)  # at most one second's worth at once
            while in_flight < self.spec.concurrency and self._loop_next <= now:
                out.append(self._arrival(now, kind="loop"))
                in_flight += 1
                self._loop_next += 1.0 / self.spec.concurrency
        while self._next <= now:
            out.append(self._arrival(self._next))
            self._next += self._gap()
        return sorted(out, key=lambda a: a.time)

    def inject(self, now: float, prompt_tokens: int | None = None, max_tokens: int | None = None) -> Arrival:
        """An injected prompt arriving now (the `inject` control; paused or not): `prompt_tokens` or the
        workload's long prompt, `max_tokens` or its longest output."""
        tokens = prompt_tokens or self.spec.long_prompt_tokens
        out = max_tokens or self.spec.output_tokens[1]
        return Arrival(now, tokens, out, "inject")

    def set_rate(self, rate: float, now: float) -> None:
        self.spec.rate = rate
        self._next = now + self._gap()

    def pause(self) -> None:
        self.spec.paused = True

    def resume(self, now: float) -> None:
        self.spec.paused = False
        self._next = now + self._gap()
        self._loop_next = now
        self._long_next = now + self.spec.long_every_s


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
