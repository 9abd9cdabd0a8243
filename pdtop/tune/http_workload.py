"""`pdtop tune --launch`'s workload, sent over a server's OpenAI API: `pdtop bench`'s scenario as HTTP
requests, or a dataset's requests. Both give an `HttpRun` that `score.score_http` scores.

Each request is sent and measured as the load generator sends and measures it
(`openai_request.stream_request`, the request `pdtop bench --url` sends: greedy, streaming, ignore_eos so
every candidate streams the same tokens), after one uncounted warm-up request.

- The scenario (`run_http`; prompts from `text_prompts`, the load generator's seeded windows of
  pdtop's corpus, sent as text): `decode_bs` streaming requests decode all along (a closed loop: each
  that ends, after `decode_tokens` tokens, is replaced), and once each of them has its first token,
  `long_prompts` long prompts arrive: one after another (each when the previous one has finished its
  `long_max_tokens` tokens), or as Poisson arrivals at `request_rate` per second. The window runs
  from the first long prompt's send to the last one's end; decode requests still running then are
  cancelled and not counted.
- A dataset (`run_dataset`; `DatasetTraffic`: `bench --url`'s reader, ShareGPT or a custom JSONL in
  seeded order, `--num-prompts` of them), sent by the load generator's `run_load` at `--request-rate`
  with Poisson arrivals (inf: all at once). The window runs from the first arrival to the last
  completion, every request that finished is a sample, and every prompt counts towards prefill
  throughput. The workload's identity (`DatasetTraffic.identity`: the file's SHA-256, its name and the
  options that shape the prompts) goes into `--results`' header, so results of another dataset are
  refused.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np

from pdtop.bench.datasets import Sample as Prompt
from pdtop.bench.loadgen import LoadRun, LoadSpec, WarmupFailed, make_prompts, run_load
from pdtop.bench.openai_request import Endpoint, RequestResult, ServerError, served_model, stream_request
from pdtop.bench.policy_bench import SCENARIOS, Scenario
from pdtop.engine.errors import EngineError
from pdtop.tune.score import HttpRun, HttpSample

WARMUP_TOKENS = 4  # the uncounted warm-up request's max_tokens
T = TypeVar("T")


def launch_scenario(kind: str) -> Scenario:
    """The default HTTP scenario for a device kind: `pdtop bench`'s, with decode requests of 128
    tokens (the loop replaces them) and three long prompts, so a launch measures in seconds."""
    return dataclasses.replace(SCENARIOS[kind], decode_tokens=128, long_prompts=3)


def text_prompts(sc: Scenario, seed: int, token_ids: list[int],
                 decode: Callable[[list[int]], str]) -> tuple[list[str], list[str]]:
    """Seeded prompt texts (loadgen's windows of pdtop's corpus): decode-sized ones, then long ones."""
    def texts(n: int, length: int, salt: int) -> list[str]:
        spec = LoadSpec(url="", num_prompts=n, input_len=length, output_len=1, seed=seed * 1000 + salt)
        return [p[0] for p in make_prompts(spec, token_ids, decode)]

    return texts(4 * sc.decode_bs, sc.decode_prompt, 1), texts(sc.long_prompts, sc.long_tokens, 2)


async def _drive(url: str, sc: Scenario, rate: float, prompts: tuple[list[str], list[str]], seed: int,
                 first_token_timeout_s: float) -> HttpRun:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as client:
        model, _ = await served_model(client, url)
        ep = Endpoint(f"{url}/v1/completions", model, ignore_eos=True)
        warm = await stream_request(client, ep, prompts[0][0], WARMUP_TOKENS)  # not counted
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

        async def send(text: str, max_tokens: int, long: bool, on_first: Callable[[], None] | None = None) -> bool:
            sent = time.perf_counter()  # on_first: the long prompts wait for every decode request to stream
            res = await stream_request(client, ep, text, max_tokens, on_first=on_first)
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
    samples = [HttpSample(long, sent - start, r.ttft, r.latency, r.output_tokens, r.prompt_tokens, r.itls)
               for t, long, sent, r in done if start < t <= end]
    return HttpRun(samples, end - start, sorted(errors), start)


def run_http(url: str, sc: Scenario, rate: float, prompts: tuple[list[str], list[str]], seed: int = 0,
             timeout_s: float = 600.0) -> HttpRun:
    """Warm the server at `url` (http://HOST:PORT) up, then run the scenario; EngineError when the
    decode requests never start or the run passes `timeout_s`."""
    return _bounded(_drive(url, sc, rate, prompts, seed, timeout_s), timeout_s)


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class DatasetTraffic:
    """A dataset's requests as a candidate's workload."""

    name: str  # sharegpt | custom
    path: str
    prompts: list[Prompt]  # (text, max_tokens, prompt tokens), in the order they are sent
    options: dict[str, Any] = field(default_factory=dict)  # what else shaped the prompts (output lengths, ...)
    digest: str = ""  # the file's SHA-256 (computed when empty)

    def __post_init__(self) -> None:
        self.digest = self.digest or file_digest(self.path)

    def identity(self) -> dict[str, Any]:
        """What a results file must match (with the command, request rate and seed beside it)."""
        return {"dataset": self.name, "file": os.path.basename(self.path), "sha256": self.digest,
                "num_prompts": len(self.prompts), **self.options}

    def describe(self) -> str:
        tokens = [p[2] for p in self.prompts]
        return (f"{len(self.prompts)} {self.name} requests from {os.path.basename(self.path)} "
                f"(prompts {min(tokens)}..{max(tokens)} tokens)")

    @property
    def longest_prompt(self) -> int:
        return max(p[2] for p in self.prompts)


def run_dataset(url: str, traffic: DatasetTraffic, rate: float, seed: int = 0, timeout_s: float = 600.0) -> HttpRun:
    """Warm the server at `url` (http://HOST:PORT) up, then send the dataset's requests; EngineError
    when the warm-up fails or the run passes `timeout_s`."""
    spec = LoadSpec(url=url, num_prompts=len(traffic.prompts), request_rate=rate, seed=seed,
                    ignore_eos=True, warmup=True)
    record = LoadRun()
    results, window = _bounded(run_load(spec, traffic.prompts, run=record), timeout_s)
    start = record.start or 0.0
    samples = [HttpSample(True, r.start_time - start, r.ttft, r.latency, r.output_tokens, r.prompt_tokens, r.itls)
               for r in results if r.ok]
    return HttpRun(samples, window, sorted({r.error for r in results if not r.ok}), start)


def _bounded(work: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run `work` to its end within `timeout_s`; what goes wrong is one EngineError line."""
    async def bounded() -> T:
        try:
            return await asyncio.wait_for(work, timeout_s)
        except TimeoutError:
            raise EngineError(f"the workload did not finish within {timeout_s:g} s") from None
        except WarmupFailed as exc:
            raise EngineError(f"the warm-up request failed: {exc}") from None
        except ServerError as exc:
            raise EngineError(str(exc)) from None
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
            raise EngineError(f"{type(exc).__name__}: {exc}") from None

    return asyncio.run(bounded())
