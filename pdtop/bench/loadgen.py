"""A load generator for any OpenAI-compatible server (pdtop's, vLLM's, SGLang's), as `vllm bench serve` 0.33.

Prompts (seeded windows of `input_len` tokens of pdtop's shipped text, cut with the local
tokenizer, or a dataset's, `bench/datasets.py`; sent as text, so any server's tokenizer reads real
words) go to `endpoint` as streaming requests (`bench/openai_request.py`: the `openai`, `vllm` and
`openai-chat` backends), at `request_rate` per second (`inf`: all at once) with vLLM's arrivals
(gamma gaps of shape `burstiness`, 1 is Poisson, scaled so the last is sent at num_prompts / rate;
or `ramp_up`'s rate rising from one request to the next, unscaled) and at most `max_concurrency` in
flight. Before the clock starts, uncounted: pdtop's warm-up (`warmup`: the first prompt once; if it
fails nothing else is sent), or vLLM's ready check (`ready_check_timeout_s`: the first prompt every
5 s until it succeeds or the time is up), then vLLM's `num_warmups` copies of the first prompt.
The figures have vLLM's definitions:
- throughput: completed requests, output tokens and input + output tokens per second of the run;
- TTFT: request sent to first streamed token; E2EL: sent to last;
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request with more than one token;
- ITL: gaps between consecutive streamed chunks, pooled over requests;
- goodput: requests per second that met every SLO given (`ttft`, `tpot`, `e2el`, in ms).
Token counts come from the server's `usage` (`stream_options.include_usage`), else from chunks.
"""
from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import httpx
import numpy as np

from pdtop.analysis.metrics import percentile
from pdtop.bench.openai_request import STALL_S, Endpoint, RequestResult, served_model, server_base, stream_request

SLO_METRICS = ("ttft", "tpot", "e2el")
READY_RETRY_S = 5.0  # vLLM's wait_for_endpoint retry interval

# A prompt: (text, max_tokens), or (text, max_tokens, prompt_len) with the prompt's length in tokens
# (vLLM's prompt_len: a failed request keeps it; the server's usage replaces it when it reports one).
Prompt = tuple[str, int] | tuple[str, int, int]
RampUp = tuple[str, int, int]  # (linear | exponential, start rps, end rps)


@dataclass
class LoadSpec:
    """The scenario (vllm bench serve's options and defaults)."""

    url: str  # the server, http://HOST:PORT (a trailing /v1 is dropped: vLLM's --base-url has none)
    model: str | None = None  # the name requests carry; None: the first model the server lists
    model_id: str | None = None  # the result's model_id (vLLM: the listed model's root); None: `model`
    endpoint: str = "/v1/completions"
    backend: str = "openai"  # openai | vllm (completions) | openai-chat
    num_prompts: int = 1000
    request_rate: float = math.inf  # requests/s; inf sends them all at once
    max_concurrency: int | None = None
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    seed: int = 0
    ignore_eos: bool = False
    goodput: dict[str, float] = field(default_factory=dict)  # SLO metric -> ms
    burstiness: float = 1.0  # shape of the gamma gaps between arrivals: 1 Poisson, < 1 burstier, inf even
    sampling: dict[str, float] = field(default_factory=lambda: {"temperature": 0.0})  # added to each body
    warmup: bool = False  # send the first prompt once, uncounted, before the clock starts (`bench --url` does)
    ready_check_timeout_s: int = 0  # vLLM's ready check instead of the warm-up (0: none)
    num_warmups: int = 0  # vLLM's uncounted copies of the first prompt after that
    ramp_up: RampUp | None = None
    stall_s: float = STALL_S  # a started stream silent this long fails

    def __post_init__(self) -> None:
        self.url = server_base(self.url)


@dataclass
class LoadRun:
    """What a run has measured so far, readable when it is interrupted: each finished request at its
    prompt's index, the clock (perf_counter) from the first arrival to the end or the interruption,
    and a ramp-up's rate changes (vLLM's `rps_change_events`)."""

    results: list[RequestResult | None] = field(default_factory=list)
    start: float | None = None
    end: float | None = None
    rps_changes: list[dict[str, Any]] = field(default_factory=list)

    def finished(self) -> list[RequestResult]:
        return [r for r in self.results if r is not None]

    def duration(self) -> float:
        if self.start is None:
            return 0.0
        return (self.end if self.end is not None else time.perf_counter()) - self.start


class WarmupFailed(Exception):
    """The uncounted first request failed: the server cannot take this load as specified."""


def make_prompts(spec: LoadSpec, token_ids: list[int],
                 decode: Callable[[list[int]], str]) -> list[tuple[str, int, int]]:
    """(prompt text, max_tokens, prompt tokens) per request: seeded windows of `token_ids` (the corpus,
    wrapping around)."""
    rng = random.Random(spec.seed)

    def length(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - spec.range_ratio)), int(n * (1 + spec.range_ratio))))

    out = []
    for _ in range(spec.num_prompts):
        n, start = length(spec.input_len), rng.randrange(len(token_ids))
        window = (token_ids * ((start + n) // len(token_ids) + 1))[start:start + n]
        out.append((decode(window), length(spec.output_len), n))
    return out


def request_rates(n: int, request_rate: float, ramp_up: RampUp | None = None) -> list[float]:
    """Each request's rate (vLLM's `_get_current_request_rate`): `request_rate`, or with a ramp-up the rate
    going from start to end by request index, linearly or exponentially."""
    if ramp_up is None:
        return [request_rate] * n
    strategy, start, end = ramp_up
    progress = [i / max(n - 1, 1) for i in range(n)]
    if strategy == "linear":
        return [start + (end - start) * p for p in progress]
    return [start * (end / start) ** p for p in progress]


def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0,
                    ramp_up: RampUp | None = None) -> list[float]:
    """Seconds after the start at which each of `n` requests is sent, as vllm bench serve's `get_request`:
    a gap per request from a gamma distribution of shape `burstiness` and mean 1 / its rate (numpy's
    legacy generator seeded with `seed`, as vLLM's `np.random.seed`; none for an infinite rate), summed,
    then, without a ramp-up, scaled so the last is at n / rate."""
    rates = request_rates(n, request_rate, ramp_up)
    if ramp_up is None and request_rate == math.inf:
        return [0.0] * n
    rng = np.random.RandomState(seed)
    gaps = [0.0 if rate == math.inf else 1.0 / rate if burstiness == math.inf
            else float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness))) for rate in rates]
    offsets = list(itertools.accumulate(gaps))
    if ramp_up is None and offsets and offsets[-1] != 0:
        scale = n / request_rate / offsets[-1]
        offsets = [t * scale for t in offsets]
    return offsets


def endpoint(spec: LoadSpec) -> Endpoint:
    """Where the spec's requests go (its model known)."""
    return Endpoint(url=spec.url + spec.endpoint, model=spec.model or "", backend=spec.backend,
                    ignore_eos=spec.ignore_eos, sampling=spec.sampling, stall_s=spec.stall_s)


async def _one(client: httpx.AsyncClient, ep: Endpoint, prompt: Prompt) -> RequestResult:
    return await stream_request(client, ep, prompt[0], prompt[1], prompt[2] if len(prompt) > 2 else 0)


async def _before_the_clock(client: httpx.AsyncClient, spec: LoadSpec, ep: Endpoint, first: Prompt) -> None:
    """The uncounted requests: pdtop's warm-up or vLLM's ready check, then vLLM's --num-warmups."""
    if spec.ready_check_timeout_s > 0:  # vLLM's wait_for_endpoint
        deadline = time.perf_counter() + spec.ready_check_timeout_s
        while True:
            test = await _one(client, ep, first)
            remaining = deadline - time.perf_counter()
            if test.ok:
                break
            if remaining <= 0:
                raise WarmupFailed(f"not ready within {spec.ready_check_timeout_s} s: {test.error}")
            await asyncio.sleep(min(READY_RETRY_S, remaining))
    elif spec.warmup:
        test = await _one(client, ep, first)
        if not test.ok:
            raise WarmupFailed(test.error)
    if spec.num_warmups > 0:
        gate = asyncio.Semaphore(spec.max_concurrency or spec.num_warmups)

        async def warm() -> None:
            async with gate:
                await _one(client, ep, first)

        await asyncio.gather(*(warm() for _ in range(spec.num_warmups)))


async def run_load(spec: LoadSpec, prompts: Sequence[Prompt], headers: dict[str, str] | None = None,
                   on_done: Callable[[RequestResult], None] | None = None,
                   run: LoadRun | None = None) -> tuple[list[RequestResult], float]:
    """Send every prompt; the results in order, and the run's duration (first arrival to last completion).
    `spec.model` (and `model_id`) are set from the server's list when `model` is None. `run`, when given,
    holds what was measured as it comes in, for a caller that is interrupted. The uncounted requests
    go first (`_before_the_clock`); WarmupFailed if the warm-up or ready check fails."""
    run = run if run is not None else LoadRun()
    run.results = [None] * len(prompts)
    offsets = arrival_offsets(len(prompts), spec.request_rate, spec.burstiness, spec.seed, spec.ramp_up)
    rates = request_rates(len(prompts), spec.request_rate, spec.ramp_up)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits, headers=headers) as client:
        if spec.model is None:
            spec.model, spec.model_id = await served_model(client, spec.url)
        ep = endpoint(spec)
        if prompts:
            await _before_the_clock(client, spec, ep, prompts[0])
        gate = asyncio.Semaphore(spec.max_concurrency or len(prompts) or 1)

        async def send(i: int, prompt: Prompt) -> RequestResult:
            arrived = time.perf_counter()
            async with gate:
                res = await _one(client, ep, prompt)
            res.queue_time = res.start_time - arrived
            run.results[i] = res
            if on_done is not None:
                on_done(res)
            return res

        start = run.start = time.perf_counter()
        last_rps = -1
        if spec.ramp_up is not None:
            last_rps = spec.ramp_up[1]
            run.rps_changes.append({"rps": last_rps, "timestamp": datetime.now().isoformat()})
        tasks = []
        try:
            for i, prompt in enumerate(prompts):
                wait = start + offsets[i] - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                if spec.ramp_up is not None and int(rates[i]) > last_rps:  # vLLM's rps_change_events
                    stamp = datetime.now().isoformat()
                    run.rps_changes += [{"rps": rps, "timestamp": stamp}
                                        for rps in range(last_rps + 1, int(rates[i]) + 1)]
                    last_rps = int(rates[i])
                tasks.append(asyncio.create_task(send(i, prompt)))
            results = list(await asyncio.gather(*tasks))
        finally:
            run.end = time.perf_counter()
            for task in tasks:
                task.cancel()
        return results, run.end - start


def metric_values(results: list[RequestResult]) -> dict[str, list[float]]:
    """Seconds per metric over the completed requests, as vLLM pools them (TPOT of those with > 1 token;
    the wait for a --max-concurrency slot, alone and added to the E2EL)."""
    done = [r for r in results if r.ok]
    return {"ttft": [r.ttft for r in done], "tpot": [r.tpot for r in done if r.output_tokens > 1],
            "itl": [g for r in done for g in r.itls], "e2el": [r.latency for r in done],
            "client_queue_time": [r.queue_time for r in done],
            "e2el_including_client_queue": [r.latency + r.queue_time for r in done]}


def _stats_ms(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)) * 1e3 if values else math.nan,
            "median": percentile(values, 50) * 1e3, "p99": percentile(values, 99) * 1e3}


def summarize(spec: LoadSpec, results: list[RequestResult], duration: float) -> dict[str, Any]:
    """vllm bench serve's figures, with the scenario (`pdtop bench --url --json`)."""
    done = [r for r in results if r.ok]
    inp, out = sum(r.prompt_tokens for r in done), sum(r.output_tokens for r in done)
    good = sum(r.meets(spec.goodput) for r in done) / duration if spec.goodput else None
    scenario = asdict(spec)
    scenario["request_rate"] = "inf" if spec.request_rate == math.inf else spec.request_rate
    values = metric_values(results)
    return {
        "scenario": scenario,
        "completed": len(done), "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration, "total_input_tokens": inp, "total_output_tokens": out,
        "request_throughput": len(done) / duration, "output_throughput": out / duration,
        "total_token_throughput": (inp + out) / duration, "goodput": good,
        **{f"{name}_ms": _stats_ms(values[name]) for name in ("ttft", "tpot", "itl", "e2el")},
    }
