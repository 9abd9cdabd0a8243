"""`vllm bench serve`'s result, for `pdtop bench --url`: the JSON `--save-result` writes and the table it
prints, with vLLM's names, definitions and order (`vllm/benchmarks/serve.py`: `calculate_metrics`,
`benchmark`, `main_async`, `compute_result_filename`).

- Statistics per metric chosen by `--percentile-metrics` (vLLM's default: ttft, tpot, itl):
  `mean_X_ms`, `median_X_ms`, `std_X_ms` and `pP_X_ms` for each of `--metric-percentiles`
  (default 99), numpy's (linear percentiles, population std), 0 where there are no values.
- The per-request arrays (`input_lens`, `output_lens`, `ttfts`, `itls`, `start_times`,
  `generated_texts`, `errors`) only with `--save-detailed`, as vLLM; `latencies` and
  `queue_times` always.
- `max_output_tokens_per_s`: the most streamed chunks in one second since the first request was sent;
  `max_concurrent_requests`: the most requests in flight at once.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the load generator load only when a result is made: `bench --help` stays fast
    from pdtop.bench.loadgen import LoadSpec, RequestResult

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
BACKEND = "openai"  # vLLM's name for the /v1/completions request function pdtop's load generator matches
_TITLES = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
           "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}


def percentile_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _peaks(done: list[RequestResult]) -> tuple[float, int]:
    """(most chunks streamed in one second, most requests in flight at once), as vLLM counts them."""
    import numpy as np

    if not done:
        return 0.0, 0
    first = min(r.start_time for r in done)
    seconds = int(np.ceil(max(r.start_time + r.latency for r in done) - first)) + 1
    per_second = np.zeros(seconds)
    for r in done:
        t = r.start_time + r.ttft
        for gap in [0.0, *r.itls]:
            t += gap
            if 0 <= int(t - first) < seconds:
                per_second[int(t - first)] += 1
    events = sorted([(r.start_time, 1) for r in done] + [(r.start_time + r.latency, -1) for r in done])
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return float(per_second.max()), peak


def result_json(spec: LoadSpec, results: list[RequestResult], duration: float, *, date: str,
                tokenizer_id: str, label: str | None = None, metrics: tuple[str, ...] = ("ttft", "tpot", "itl"),
                percentiles: tuple[float, ...] = (99.0,), detailed: bool = False) -> dict[str, Any]:
    """The object vLLM's `--save-result` writes, key for key, in its order."""
    import numpy as np

    from pdtop.bench.loadgen import metric_values

    done = [r for r in results if r.ok]
    output_lens = [r.output_tokens if r.ok else 0 for r in results]
    total_in, total_out = sum(r.prompt_tokens for r in done), sum(output_lens)
    good = sum(r.meets(spec.goodput) for r in done) / duration if spec.goodput else None
    peak_tokens, peak_requests = _peaks(done)
    out: dict[str, Any] = {
        "date": date, "endpoint_type": BACKEND, "backend": BACKEND, "label": label, "model_id": spec.model,
        "tokenizer_id": tokenizer_id, "num_prompts": spec.num_prompts,
        "request_rate": spec.request_rate if spec.request_rate < math.inf else "inf",
        "burstiness": spec.burstiness, "max_concurrency": spec.max_concurrency,
        "duration": duration, "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration, "request_goodput": good,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [r.prompt_tokens for r in results], "output_lens": output_lens,
        "ttfts": [r.ttft for r in results], "itls": [r.itls for r in results],
        "latencies": [r.latency for r in results], "start_times": [r.start_time for r in results],
        "queue_times": [r.queue_time for r in results], "generated_texts": [r.text for r in results],
        "errors": [r.error for r in results],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
    }
    if not detailed:
        for name in DETAILED_FIELDS:
            del out[name]
    values = metric_values(results)
    for name in PERCENTILE_METRICS:  # vLLM's order, whatever order they were asked in
        if name in metrics:
            v = values[name] or [0.0]
            out[f"mean_{name}_ms"] = float(np.mean(v)) * 1e3
            out[f"median_{name}_ms"] = float(np.median(v)) * 1e3
            out[f"std_{name}_ms"] = float(np.std(v)) * 1e3
            for p in percentiles:
                out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(v, p)) * 1e3
    return out


def result_table(result: dict[str, Any], metrics: tuple[str, ...], percentiles: tuple[float, ...]) -> str:
    """The result as `vllm bench serve` prints it."""
    r = result
    lines = [f"{' Serving Benchmark Result ':=^50}",
             f"{'Successful requests:':<40} {r['completed']:<10}",
             f"{'Failed requests:':<40} {r['failed']:<10}"]
    if r["max_concurrency"] is not None:
        lines.append(f"{'Maximum request concurrency:':<40} {r['max_concurrency']:<10}")
    if r["request_rate"] != "inf":
        lines.append(f"{'Request rate configured (RPS):':<40} {r['request_rate']:<10.2f}")
    lines += [f"{'Benchmark duration (s):':<40} {r['duration']:<10.2f}",
              f"{'Total input tokens:':<40} {r['total_input_tokens']:<10}",
              f"{'Total generated tokens:':<40} {r['total_output_tokens']:<10}",
              f"{'Request throughput (req/s):':<40} {r['request_throughput']:<10.2f}"]
    if r["request_goodput"] is not None:
        lines.append(f"{'Request goodput (req/s):':<40} {r['request_goodput']:<10.2f}")
    lines += [f"{'Output token throughput (tok/s):':<40} {r['output_throughput']:<10.2f}",
              f"{'Peak output token throughput (tok/s):':<40} {r['max_output_tokens_per_s']:<10.2f}",
              f"{'Peak concurrent requests:':<40} {r['max_concurrent_requests']:<10.2f}",
              f"{'Total token throughput (tok/s):':<40} {r['total_token_throughput']:<10.2f}"]
    for name in PERCENTILE_METRICS:
        if name not in metrics:
            continue
        short, title = _TITLES[name]
        lines.append(f"{title:-^50}")
        lines.append(f"{f'Mean {short} (ms):':<40} {r[f'mean_{name}_ms']:<10.2f}")
        lines.append(f"{f'Median {short} (ms):':<40} {r[f'median_{name}_ms']:<10.2f}")
        for p in percentiles:
            word = percentile_word(p)
            lines.append(f"{f'P{word} {short} (ms):':<40} {r[f'p{word}_{name}_ms']:<10.2f}")
    lines.append("=" * 50)
    return "\n".join(lines)


def result_filename(result: dict[str, Any], filename: str | None, result_dir: str | None) -> str:
    """vLLM's `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`, or `filename`, under `result_dir`."""
    rate = result["request_rate"] if result["request_rate"] == "inf" else float(result["request_rate"])
    concurrency = f"-concurrency{result['max_concurrency']}" if result["max_concurrency"] is not None else ""
    model = str(result["model_id"]).split("/")[-1]
    name = filename or f"{result['label'] or BACKEND}-{rate}qps{concurrency}-{model}-{result['date']}.json"
    return os.path.join(result_dir, name) if result_dir else name
