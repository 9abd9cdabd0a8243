"""What a `pdtop tune` candidate measured, and whether it meets the SLOs: the figures of a window
(`Measurement`), the SLOs (`Slo`), and a window's requests scored two ways.

- On an engine (`score`, from `RequestSample`s): a request is good when its TTFT (if it arrived in the
  window) meets the TTFT SLO and the p99 of its ITLs in the window meets the ITL SLO.
- Over a server's OpenAI API (`score_http`, from the requests that finished in the window, `Sample`),
  per request as `vllm bench serve --goodput` counts it: good when its TTFT meets the TTFT SLO and its
  TPOT ((end - first token) / (tokens - 1), vLLM's `--goodput tpot:MS`) meets the ITL SLO. There
  `itl_p99_s` is the p99 over requests of their TPOT (so a configuration meets the ITL SLO when 99% of
  its requests do), and prefill throughput counts the long prompts' tokens over the time they waited.
  Where the server's decode rounds were read over the window (`RoundItls`, `round_reader`), `itl_p99_s` is
  their ITL p99 instead, as on an engine, and goodput still counts each request's TPOT.

Goodput is good requests per second of the window.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdtop.analysis.metrics import percentile

ITL, ROUNDS, TPOT, MIXED = "itl", "rounds", "tpot", "mixed"
ITL_LABELS = {ITL: "ITL p99", ROUNDS: "ITL p99 (rounds)", TPOT: "TPOT p99", MIXED: "ITL/TPOT p99"}


@dataclass(frozen=True)
class Measurement:
    """One candidate's figures. Times in seconds; NaN where there was nothing to measure."""

    itl_p99_s: float
    ttft_p99_s: float
    prefill_tok_s: float  # prompt tokens per second while prompts waited for their first token
    goodput_rps: float  # requests per second of the window that met every SLO
    good: int = 0
    requests: int = 0
    window_s: float = 0.0
    decode_only_itl_s: float = math.nan  # median decode step with every unit to decode, nothing else
    itl_from: str = ITL  # what itl_p99_s is: ITL (an engine's tokens), ROUNDS (a server's), TPOT, or MIXED


@dataclass(frozen=True)
class Slo:
    itl_s: float
    ttft_s: float | None = None

    def excess(self, m: Measurement) -> float:
        """The worst measured/target ratio over the SLOs: <= 1 meets them all (NaN counts as a miss)."""
        ratios = [m.itl_p99_s / self.itl_s] + ([m.ttft_p99_s / self.ttft_s] if self.ttft_s else [])
        return max(math.inf if math.isnan(r) else r for r in ratios)

    def met(self, m: Measurement) -> bool:
        return self.excess(m) <= 1.0


@dataclass
class RequestSample:
    """What one request did in the measured window: its TTFT (None if it arrived before) and ITLs."""

    ttft_s: float | None
    itls_s: list[float]

    def good(self, slo: Slo) -> bool:
        ttft_ok = slo.ttft_s is None or self.ttft_s is None or self.ttft_s <= slo.ttft_s
        return ttft_ok and (not self.itls_s or percentile(self.itls_s, 99) <= slo.itl_s)


def covered_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of `[start, end]` intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def score(samples: Sequence[RequestSample], slo: Slo, window_s: float, prompt_tokens: int, prefill_wait_s: float,
          decode_only_itl_s: float = math.nan) -> Measurement:
    """Figures of a window: ITL p99 over every request's ITLs, TTFT p99 over those that arrived in it,
    prefill throughput (`prompt_tokens` over `prefill_wait_s`, the time prompts waited) and goodput."""
    itls = [x for s in samples for x in s.itls_s]
    ttfts = [s.ttft_s for s in samples if s.ttft_s is not None]
    good = sum(s.good(slo) for s in samples)
    return Measurement(
        itl_p99_s=percentile(itls, 99), ttft_p99_s=percentile(ttfts, 99),
        prefill_tok_s=prompt_tokens / prefill_wait_s if prefill_wait_s > 0 else math.nan,
        goodput_rps=good / window_s if window_s > 0 else math.nan, good=good, requests=len(samples),
        window_s=window_s, decode_only_itl_s=decode_only_itl_s)


@dataclass
class HttpSample:
    """One request over HTTP that finished in the window; times in seconds, `sent_s` from the window's start."""

    long: bool
    sent_s: float
    ttft_s: float
    latency_s: float
    output_tokens: int
    prompt_tokens: int
    itls_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        n = self.output_tokens
        return (self.latency_s - self.ttft_s) / (n - 1) if n > 1 else 0.0

    def good(self, slo: Slo) -> bool:
        return (slo.ttft_s is None or self.ttft_s <= slo.ttft_s) and self.tpot_s <= slo.itl_s

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["itls_s"] = [round(x, 6) for x in self.itls_s]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HttpSample:
        return cls(bool(d["long"]), float(d["sent_s"]), float(d["ttft_s"]), float(d["latency_s"]),
                   int(d["output_tokens"]), int(d["prompt_tokens"]), [float(x) for x in d["itls_s"]])


@dataclass(frozen=True)
class RoundItls:
    """ITLs of the decode rounds a server reported over a candidate's window (`round_reader.round_itls`)."""

    itl_p50_s: float
    itl_p99_s: float
    rounds: int  # rounds with a decode batch
    gaps: int  # ITLs counted (a gap once per request in its batch)

    def to_json(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundItls:
        return cls(float(d["itl_p50_s"]), float(d["itl_p99_s"]), int(d["rounds"]), int(d["gaps"]))


@dataclass
class HttpRun:
    """A candidate's window over HTTP: the requests that finished in it, and why others failed; the
    server's decode rounds over it where they were read, else why not (`no_rounds`)."""

    samples: list[HttpSample]
    window_s: float
    errors: list[str]  # distinct errors of requests that failed (they are not samples)
    start: float = math.nan  # time.perf_counter() at the window's start (not kept in --results)
    rounds: RoundItls | None = None
    no_rounds: str = ""


def score_http(run: HttpRun, slo: Slo) -> Measurement:
    """Figures of an HTTP window: the server's rounds' ITL p99 where they were read, else TPOT p99 over its
    requests (as `itl_p99_s`), TTFT p99, the long prompts' prefill throughput, and goodput counted per
    request as vLLM's `--goodput` counts it."""
    longs = [s for s in run.samples if s.long]
    good = sum(s.good(slo) for s in run.samples)
    waits = covered_s((s.sent_s, s.sent_s + s.ttft_s) for s in longs)
    itl, kind = ((percentile([s.tpot_s for s in run.samples if s.output_tokens > 1], 99), TPOT)
                 if run.rounds is None else (run.rounds.itl_p99_s, ROUNDS))
    return Measurement(
        itl_p99_s=itl, itl_from=kind,
        ttft_p99_s=percentile([s.ttft_s for s in run.samples], 99),
        prefill_tok_s=sum(s.prompt_tokens for s in longs) / waits if waits > 0 else math.nan,
        goodput_rps=good / run.window_s if run.window_s > 0 else math.nan, good=good,
        requests=len(run.samples), window_s=run.window_s)


def itl_kind(ms: Iterable[Measurement]) -> str:
    """What the ITL figures of `ms` are: one kind, or MIXED."""
    kinds = {m.itl_from for m in ms}
    return kinds.pop() if len(kinds) == 1 else MIXED
