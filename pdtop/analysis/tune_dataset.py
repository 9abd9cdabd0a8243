"""`pdtop tune --launch --dataset-path FILE`: a dataset's requests as a candidate's workload.

The prompts are `bench --url`'s (`bench_datasets`: ShareGPT or a custom JSONL, in seeded order,
`--num-prompts` of them), sent by the load generator's `run_load` (each on
`loadgen.stream_completion`, with ignore_eos so every candidate streams the same tokens) at
`--request-rate` with Poisson arrivals (inf: all at once), after one uncounted warm-up request.
The window runs from the first arrival to the last completion, and every request that finished
is a sample, scored by `tune_http.score_http` as the scenario's are; every prompt counts towards
prefill throughput (its tokens over the time its request waited for its first token).

The workload's identity (`DatasetTraffic.identity`: the file's SHA-256, its name and the options
that shape the prompts) goes into `--results`' header, so results of another dataset are refused.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from pdtop.analysis.bench_datasets import Sample as Prompt
from pdtop.analysis.loadgen import LoadRun, LoadSpec, WarmupFailed, run_load
from pdtop.analysis.tune_http import HttpRun, Sample
from pdtop.engine.errors import EngineError


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class DatasetTraffic:
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
    spec = LoadSpec(url=url + "/v1", num_prompts=len(traffic.prompts), request_rate=rate, seed=seed,
                    ignore_eos=True, warmup=True)
    record = LoadRun()

    async def bounded() -> tuple[list[Any], float]:
        try:
            return await asyncio.wait_for(run_load(spec, traffic.prompts, run=record), timeout_s)
        except TimeoutError:
            raise EngineError(f"the workload did not finish within {timeout_s:g} s") from None
        except WarmupFailed as exc:
            raise EngineError(f"the warm-up request failed: {exc}") from None
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
            raise EngineError(f"{type(exc).__name__}: {exc}") from None

    results, window = asyncio.run(bounded())
    start = record.start or 0.0
    samples = [Sample(True, r.start_time - start, r.ttft, r.latency, r.output_tokens, r.prompt_tokens, r.itls)
               for r in results if r.ok]
    return HttpRun(samples, window, sorted({r.error for r in results if not r.ok}))
