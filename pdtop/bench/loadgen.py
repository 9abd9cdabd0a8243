"""A load generator for any OpenAI-compatible server (pdtop's, vLLM's, SGLang's), as `vllm bench serve`.

Prompts (seeded windows of `input_len` tokens of pdtop's shipped text, cut with a GGUF
tokenizer, or a dataset's, `bench/datasets.py`; sent as text, so any server's
tokenizer reads real words) go to `/v1/completions` as streaming requests, at `request_rate`
per second (`inf`: all at once) with vLLM's arrivals (gamma gaps of shape `burstiness`, 1 is
Poisson, scaled so the last is sent at num_prompts / rate) and at most `max_concurrency` in
flight. With `warmup`, the first prompt is sent once before the clock starts and not counted
(vLLM's initial test prompt). The figures have vLLM's definitions:
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
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from pdtop.analysis.metrics import percentile

SLO_METRICS = ("ttft", "tpot", "e2el")

# A prompt: (text, max_tokens), or (text, max_tokens, prompt_len) where a dataset counted the
# prompt's tokens with its own tokenizer (vLLM's prompt_len; used when the server reports no usage).
Prompt = tuple[str, int] | tuple[str, int, int]


@dataclass
class LoadSpec:
    """The scenario (vllm bench serve's options and defaults)."""

    url: str  # base URL, http://HOST:PORT/v1
    model: str | None = None  # None: the first model the server lists
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
    warmup: bool = False  # send the first prompt once, uncounted, before the clock starts (`bench --url` does)


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""
    text: str = ""  # the streamed completion
    start_time: float = 0.0  # time.perf_counter() when the request was sent
    queue_time: float = 0.0  # seconds it waited for a --max-concurrency slot before that

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def meets(self, goodput: dict[str, float]) -> bool:
        """Every SLO (metric -> ms) met, as vLLM's `calculate_metrics` counts it: the SLO in seconds
        against the value, a value equal to its SLO meeting it."""
        value = {"ttft": self.ttft, "tpot": self.tpot, "e2el": self.latency}
        return all(slo / 1e3 >= value[k] for k, slo in goodput.items())


@dataclass
class LoadRun:
    """What a run has measured so far, readable when it is interrupted: each finished request at its
    prompt's index, and the clock (perf_counter) from the first arrival to the end or the interruption."""

    results: list[RequestResult | None] = field(default_factory=list)
    start: float | None = None
    end: float | None = None

    def finished(self) -> list[RequestResult]:
        return [r for r in self.results if r is not None]

    def duration(self) -> float:
        if self.start is None:
            return 0.0
        return (self.end if self.end is not None else time.perf_counter()) - self.start


class WarmupFailed(Exception):
    """The uncounted first request failed: the server cannot take this load as specified."""


def make_prompts(spec: LoadSpec, token_ids: list[int], decode: Callable[[list[int]], str]) -> list[tuple[str, int]]:
    """(prompt text, max_tokens) per request: seeded windows of `token_ids` (the corpus, wrapping around)."""
    rng = random.Random(spec.seed)

    def length(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - spec.range_ratio)), int(n * (1 + spec.range_ratio))))

    out = []
    for _ in range(spec.num_prompts):
        n, start = length(spec.input_len), rng.randrange(len(token_ids))
        window = (token_ids * ((start + n) // len(token_ids) + 1))[start:start + n]
        out.append((decode(window), length(spec.output_len)))
    return out


def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of `n` requests is sent, as vllm bench serve's `get_request`:
    gaps from a gamma distribution of shape `burstiness` and mean 1 / rate (numpy's legacy generator
    seeded with `seed`, as vLLM's `np.random.seed`), summed, then scaled so the last is at n / rate."""
    if request_rate == math.inf:
        return [0.0] * n
    if burstiness == math.inf:
        gaps = [1.0 / request_rate] * n
    else:
        rng = np.random.RandomState(seed)
        theta = 1.0 / (request_rate * burstiness)
        gaps = [float(rng.gamma(shape=burstiness, scale=theta)) for _ in range(n)]
    offsets = list(itertools.accumulate(gaps))
    if offsets and offsets[-1] != 0:
        scale = n / request_rate / offsets[-1]
        offsets = [t * scale for t in offsets]
    return offsets


async def _one(client: httpx.AsyncClient, spec: LoadSpec, model: str, prompt: Prompt) -> RequestResult:
    return await stream_completion(client, spec.url, model, prompt[0], prompt[1], spec.ignore_eos,
                                   prompt[2] if len(prompt) > 2 else 0)


async def stream_completion(client: httpx.AsyncClient, url: str, model: str, text: str, max_tokens: int,
                            ignore_eos: bool, prompt_tokens: int = 0,
                            on_first: Callable[[], None] | None = None) -> RequestResult:
    """One greedy streaming `/v1/completions` request (usage included), measured: TTFT, each token gap,
    latency, the text; `on_first()` is called at its first token. Errors are in the result, not raised."""
    body: dict[str, Any] = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    res = RequestResult(ok=False, prompt_tokens=prompt_tokens)
    chunks, pieces = 0, []
    sent = last = res.start_time = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                data = json.loads(line[6:])
                if "error" in data:
                    res.error = str(data["error"].get("message", data["error"]))[:200]
                    return res
                if data.get("usage"):
                    res.prompt_tokens = data["usage"]["prompt_tokens"]
                    res.output_tokens = data["usage"]["completion_tokens"]
                if data.get("choices"):
                    if chunks == 0:
                        res.ttft = now - sent
                        if on_first is not None:
                            on_first()
                    else:
                        res.itls.append(now - last)
                    chunks, last = chunks + 1, now
                    pieces.append(str(data["choices"][0].get("text") or ""))
        res.latency = last - sent
        res.output_tokens = res.output_tokens or chunks
        res.text = "".join(pieces)
        res.ok = chunks > 0
        res.error = "" if res.ok else "no tokens streamed"
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
    return res


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    r = await client.get(f"{url}/models")
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


async def run_load(spec: LoadSpec, prompts: Sequence[Prompt], headers: dict[str, str] | None = None,
                   on_done: Callable[[RequestResult], None] | None = None,
                   run: LoadRun | None = None) -> tuple[list[RequestResult], float]:
    """Send every prompt; the results in order, and the run's duration (first arrival to last completion).
    `spec.model` is set to the served model when it was None. `run`, when given, holds what was measured
    as it comes in, for a caller that is interrupted. With `spec.warmup` the first prompt goes once before
    the clock starts, uncounted; WarmupFailed if it fails."""
    run = run if run is not None else LoadRun()
    run.results = [None] * len(prompts)
    offsets = arrival_offsets(len(prompts), spec.request_rate, spec.burstiness, spec.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits, headers=headers) as client:
        spec.model = spec.model or await served_model(client, spec.url)
        if spec.warmup and prompts:
            test = await _one(client, spec, spec.model, prompts[0])
            if not test.ok:
                raise WarmupFailed(test.error)
        gate = asyncio.Semaphore(spec.max_concurrency or len(prompts) or 1)

        async def send(i: int, prompt: Prompt) -> RequestResult:
            arrived = time.perf_counter()
            async with gate:
                res = await _one(client, spec, spec.model or "", prompt)
            res.queue_time = res.start_time - arrived
            run.results[i] = res
            if on_done is not None:
                on_done(res)
            return res

        start = run.start = time.perf_counter()
        tasks = []
        try:
            for i, prompt in enumerate(prompts):
                wait = start + offsets[i] - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(send(i, prompt)))
            results = list(await asyncio.gather(*tasks))
        finally:
            run.end = time.perf_counter()
            for task in tasks:
                task.cancel()
        return results, run.end - start


def metric_values(results: list[RequestResult]) -> dict[str, list[float]]:
    """Seconds per metric over the completed requests, as vLLM pools them (TPOT of those with > 1 token)."""
    done = [r for r in results if r.ok]
    return {"ttft": [r.ttft for r in done], "tpot": [r.tpot for r in done if r.output_tokens > 1],
            "itl": [g for r in done for g in r.itls], "e2el": [r.latency for r in done]}


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
