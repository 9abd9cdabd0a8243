"""`pdtop tune --launch`'s workload, sent over a server's OpenAI API, and its score, per request as
`vllm bench serve --goodput` counts it.

The prompts are the load generator's (`loadgen.make_prompts`: seeded windows of pdtop's corpus,
sent as text), each request is sent and measured as the load generator does, with a hook at the
first token (`stream_one`, on `loadgen.stream_completion`, the request `pdtop bench --url` sends).

The traffic is `pdtop bench`'s scenario (`Scenario`) as HTTP requests: `decode_bs` streaming
requests decode all along (a closed loop: each that ends, after `decode_tokens` tokens, is
replaced), and once each of them has its first token, `long_prompts` long prompts arrive: one
after another (each when the previous one has finished its `long_max_tokens` tokens), or as
Poisson arrivals at `request_rate` per second. The window runs from the first long prompt's
send to the last one's end; decode requests still running then are cancelled and not counted.

Scored over the requests that finished in the window: a request is good when its TTFT meets the
TTFT SLO and its TPOT ((end - first token) / (tokens - 1), vLLM's `--goodput tpot:MS`) meets the
ITL SLO; goodput is good requests per second of the window. The figures beside it, in
`Measurement`: `itl_p99_s` is the p99 over requests of their TPOT (so a configuration meets the
ITL SLO when 99% of its requests do), TTFT p99 over the requests, and prefill throughput (the
long prompts' tokens over the time they waited for their first token).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from pdtop.analysis.loadgen import LoadSpec, RequestResult, make_prompts, served_model, stream_completion
from pdtop.analysis.metrics import percentile
from pdtop.analysis.policy_bench import SCENARIOS, Scenario
from pdtop.analysis.tune import Measurement, Slo, covered_s
from pdtop.engine.errors import EngineError

WARMUP_TOKENS = 4  # the uncounted warm-up request's max_tokens


def launch_scenario(kind: str) -> Scenario:
    """The default HTTP scenario for a device kind: `pdtop bench`'s, with decode requests of 128
    tokens (the loop replaces them) and three long prompts, so a launch measures in seconds."""
    return dataclasses.replace(SCENARIOS[kind], decode_tokens=128, long_prompts=3)


@dataclass
class Sample:
    """One request that finished in the window; times in seconds, `sent_s` from the window's start."""

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
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(bool(d["long"]), float(d["sent_s"]), float(d["ttft_s"]), float(d["latency_s"]),
                   int(d["output_tokens"]), int(d["prompt_tokens"]), [float(x) for x in d["itls_s"]])


@dataclass
class HttpRun:
    samples: list[Sample]
    window_s: float
    errors: list[str]  # distinct errors of requests that failed (they are not samples)


def score_http(run: HttpRun, slo: Slo) -> Measurement:
    longs = [s for s in run.samples if s.long]
    good = sum(s.good(slo) for s in run.samples)
    waits = covered_s((s.sent_s, s.sent_s + s.ttft_s) for s in longs)
    return Measurement(
        itl_p99_s=percentile([s.tpot_s for s in run.samples if s.output_tokens > 1], 99),
        ttft_p99_s=percentile([s.ttft_s for s in run.samples], 99),
        prefill_tok_s=sum(s.prompt_tokens for s in longs) / waits if waits > 0 else math.nan,
        goodput_rps=good / run.window_s if run.window_s > 0 else math.nan, good=good,
        requests=len(run.samples), window_s=run.window_s)


async def stream_one(client: httpx.AsyncClient, url: str, model: str, text: str, max_tokens: int,
                     on_first: Callable[[], None] | None = None) -> RequestResult:
    """One request as the load generator sends it (greedy, ignore_eos), `on_first()` at its first token:
    the long prompts wait for every decode request to be streaming."""
    return await stream_completion(client, url, model, text, max_tokens, True, on_first=on_first)


def text_prompts(sc: Scenario, seed: int, token_ids: list[int], decode: Any) -> tuple[list[str], list[str]]:
    """Seeded prompt texts (loadgen's windows of pdtop's corpus): decode-sized ones, then long ones."""
    def texts(n: int, length: int, salt: int) -> list[str]:
        spec = LoadSpec(url="", num_prompts=n, input_len=length, output_len=1, seed=seed * 1000 + salt)
        return [p for p, _ in make_prompts(spec, token_ids, decode)]

    return texts(4 * sc.decode_bs, sc.decode_prompt, 1), texts(sc.long_prompts, sc.long_tokens, 2)


async def _drive(url: str, sc: Scenario, rate: float, prompts: tuple[list[str], list[str]], seed: int,
                 first_token_timeout_s: float) -> HttpRun:
    base = url + "/v1"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as client:
        model = await served_model(client, base)
        warm = await stream_one(client, base, model, prompts[0][0], WARMUP_TOKENS)  # not counted
        if not warm.ok:
            raise EngineError(f"the warm-up request failed: {warm.error}")
        decode_texts, long_texts = prompts
        first, broken = asyncio.Event(), asyncio.Event()  # every decoder started / one failed before it did
        started, ending = 0, False
        done: list[tuple[float, bool, float, RequestResult]] = []  # (end time, long, sent, result)
        errors: set[str] = set()

        def one_started() -> None:
            nonlocal started
            started += 1
            if started >= sc.decode_bs:
                first.set()

        async def send(text: str, max_tokens: int, long: bool, on_first: Any = None) -> bool:
            sent = time.perf_counter()
            res = await stream_one(client, base, model, text, max_tokens, on_first)
            if not res.ok:
                errors.add(res.error)
                return False
            done.append((time.perf_counter(), long, sent, res))
            return True

        async def decoder(i: int) -> None:
            j = i
            ok = await send(decode_texts[j % len(decode_texts)], sc.decode_tokens, False, one_started)
            if not ok:
                broken.set()
            while ok and not ending:
                j += sc.decode_bs
                ok = await send(decode_texts[j % len(decode_texts)], sc.decode_tokens, False)

        decoders = [asyncio.create_task(decoder(i)) for i in range(sc.decode_bs)]
        try:
            waits = [asyncio.create_task(first.wait()), asyncio.create_task(broken.wait())]
            await asyncio.wait(waits, timeout=first_token_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()
            if not first.is_set():
                why = f": {sorted(errors)[0]}" if errors else f" within {first_token_timeout_s:g} s"
                raise EngineError(f"the {sc.decode_bs} decode requests did not all stream a first token{why}")
            start = time.perf_counter()
            if rate == math.inf:
                for text in long_texts:
                    await send(text, sc.long_max_tokens, True)
            else:
                gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(long_texts))
                tasks = []
                for text, gap in zip(long_texts, gaps, strict=True):
                    tasks.append(asyncio.create_task(send(text, sc.long_max_tokens, True)))
                    await asyncio.sleep(float(gap))
                await asyncio.gather(*tasks)
            end = time.perf_counter()
        finally:
            ending = True
            for decoding in decoders:
                decoding.cancel()
            await asyncio.gather(*decoders, return_exceptions=True)
    samples = [Sample(long, sent - start, r.ttft, r.latency, r.output_tokens, r.prompt_tokens, r.itls)
               for t, long, sent, r in done if start < t <= end]
    return HttpRun(samples, end - start, sorted(errors))


def run_http(url: str, sc: Scenario, rate: float, prompts: tuple[list[str], list[str]], seed: int = 0,
             timeout_s: float = 600.0) -> HttpRun:
    """Warm the server at `url` (http://HOST:PORT) up, then run the scenario; EngineError when the
    decode requests never start or the run passes `timeout_s`."""
    async def bounded() -> HttpRun:
        try:
            return await asyncio.wait_for(_drive(url, sc, rate, prompts, seed, timeout_s), timeout_s)
        except TimeoutError:
            raise EngineError(f"the workload did not finish within {timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise EngineError(f"{type(exc).__name__}: {exc}") from None

    return asyncio.run(bounded())
