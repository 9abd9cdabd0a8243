"""A load generator for any OpenAI-compatible server (pdtop's, vLLM's, SGLang's), as `vllm bench serve`.

Seeded prompts of `input_len` tokens (windows of pdtop's shipped text, cut with a GGUF
tokenizer and sent as text, so any server's tokenizer reads real words) go to
`/v1/completions` as streaming requests, at Poisson arrivals of `request_rate` per second
(`inf`: all at once) and at most `max_concurrency` in flight, each asking for `output_len`
tokens. The figures have vLLM's definitions:
- throughput: completed requests, output tokens and input + output tokens per second of the run;
- TTFT: request sent to first streamed token; E2EL: sent to last;
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request with more than one token;
- ITL: gaps between consecutive streamed chunks, pooled over requests;
- goodput: requests per second that met every SLO given (`ttft`, `tpot`, `e2el`, in ms).
Token counts come from the server's `usage` (`stream_options.include_usage`), else from chunks.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from pdtop.analysis.metrics import percentile

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class LoadSpec:
    """The scenario (vllm bench serve's options and defaults)."""

    url: str  # base URL, http://HOST:PORT/v1
    model: str | None = None  # None: the first model the server lists
    num_prompts: int = 1000
    request_rate: float = math.inf  # requests/s, Poisson; inf sends them all at once
    max_concurrency: int | None = None
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    seed: int = 0
    ignore_eos: bool = False
    goodput: dict[str, float] = field(default_factory=dict)  # SLO metric -> ms


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


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


async def _one(client: httpx.AsyncClient, spec: LoadSpec, model: str, prompt: str, max_tokens: int) -> RequestResult:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if spec.ignore_eos:
        body["ignore_eos"] = True
    res = RequestResult(ok=False)
    chunks = 0
    sent = last = time.perf_counter()
    try:
        async with client.stream("POST", f"{spec.url}/completions", json=body) as r:
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
                    else:
                        res.itls.append(now - last)
                    chunks, last = chunks + 1, now
        res.latency = last - sent
        res.output_tokens = res.output_tokens or chunks
        res.ok = chunks > 0
        res.error = "" if res.ok else "no tokens streamed"
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
    return res


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    r = await client.get(f"{url}/models")
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


async def run_load(spec: LoadSpec, prompts: list[tuple[str, int]], headers: dict[str, str] | None = None,
                   on_done: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float]:
    """Send every prompt; the results in order, and the run's duration (first send to last completion).
    `spec.model` is set to the served model when it was None."""
    rng = np.random.default_rng(spec.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits, headers=headers) as client:
        spec.model = spec.model or await served_model(client, spec.url)
        gate = asyncio.Semaphore(spec.max_concurrency or len(prompts) or 1)

        async def send(prompt: str, max_tokens: int) -> RequestResult:
            async with gate:
                res = await _one(client, spec, spec.model or "", prompt, max_tokens)
            if on_done is not None:
                on_done(res)
            return res

        start = time.perf_counter()
        tasks = []
        for prompt, max_tokens in prompts:
            tasks.append(asyncio.create_task(send(prompt, max_tokens)))
            if spec.request_rate != math.inf:
                await asyncio.sleep(float(rng.exponential(1.0 / spec.request_rate)))
        results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - start


def _stats_ms(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)) * 1e3 if values else math.nan,
            "median": percentile(values, 50) * 1e3, "p99": percentile(values, 99) * 1e3}


def summarize(spec: LoadSpec, results: list[RequestResult], duration: float) -> dict[str, Any]:
    """vllm bench serve's figures, with the scenario."""
    done = [r for r in results if r.ok]
    inp, out = sum(r.prompt_tokens for r in done), sum(r.output_tokens for r in done)
    good = None
    if spec.goodput:
        ms = {"ttft": lambda r: r.ttft, "tpot": lambda r: r.tpot, "e2el": lambda r: r.latency}
        good = sum(all(ms[k](r) * 1e3 <= slo for k, slo in spec.goodput.items()) for r in done) / duration
    scenario = asdict(spec)
    scenario["request_rate"] = "inf" if spec.request_rate == math.inf else spec.request_rate
    return {
        "scenario": scenario,
        "completed": len(done), "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration, "total_input_tokens": inp, "total_output_tokens": out,
        "request_throughput": len(done) / duration, "output_throughput": out / duration,
        "total_token_throughput": (inp + out) / duration, "goodput": good,
        "ttft_ms": _stats_ms([r.ttft for r in done]),
        "tpot_ms": _stats_ms([r.tpot for r in done if r.output_tokens > 1]),
        "itl_ms": _stats_ms([g for r in done for g in r.itls]),
        "e2el_ms": _stats_ms([r.latency for r in done]),
    }


def table(summary: dict[str, Any]) -> str:
    """The summary as `vllm bench serve` prints it."""
    s = summary
    lines = [f"{' Serving Benchmark Result ':=^60}",
             f"{'Successful requests:':<40}{s['completed']:<10}",
             f"{'Failed requests:':<40}{s['failed']:<10}",
             f"{'Benchmark duration (s):':<40}{s['duration_s']:<10.2f}",
             f"{'Total input tokens:':<40}{s['total_input_tokens']:<10}",
             f"{'Total generated tokens:':<40}{s['total_output_tokens']:<10}",
             f"{'Request throughput (req/s):':<40}{s['request_throughput']:<10.2f}",
             f"{'Output token throughput (tok/s):':<40}{s['output_throughput']:<10.2f}",
             f"{'Total token throughput (tok/s):':<40}{s['total_token_throughput']:<10.2f}"]
    if s["goodput"] is not None:
        lines.append(f"{'Request goodput (req/s):':<40}{s['goodput']:<10.2f}")
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-token Latency"), ("e2el_ms", "End-to-end Latency")):
        short = key.split("_")[0].upper()
        lines.append(f"{' ' + title + ' ':-^60}")
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            lines.append(f"{f'{name} {short} (ms):':<40}{s[key][stat]:<10.2f}")
    lines.append("=" * 60)
    return "\n".join(lines)
