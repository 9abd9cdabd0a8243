"""`vllm bench serve`'s result, for `pdtop bench --url`: the JSON `--save-result` writes and the table it
prints, with vLLM 0.33.0's names, definitions and order (`vllm/benchmarks/serve.py`: `calculate_metrics`,
`benchmark`, `main_async`, `compute_result_filename`).

- The setup (`date`, `backend`, `label`, `model_id`, ...), then `--metadata`'s keys, the traffic
  (`request_rate`, `burstiness`, `max_concurrency`, a ramp-up's three), then the figures; a key
  given twice keeps its first place and its last value, as vLLM's dict updates do.
- Statistics per metric chosen by `--percentile-metrics` (vLLM's default: ttft, tpot, itl):
  `mean_X_ms`, `median_X_ms`, `std_X_ms` and `pP_X_ms` for each of `--metric-percentiles`
  (default 99), numpy's (linear percentiles, population std), 0 where there are no values.
  `client_queue_time` (the wait for a `--max-concurrency` slot) and `e2el_including_client_queue`
  are reported only with `--max-concurrency`, the second only at a finite `--request-rate`, over
  the completed requests, as vLLM 0.33 does.
- The per-request arrays (`input_lens`, `output_lens`, `ttfts`, `itls`, `start_times`,
  `generated_texts`, `errors`) only with `--save-detailed`, as vLLM; `latencies` and
  `queue_times` always. `rtfx` (audio seconds per second) is 0: text has no audio.
- `max_output_tokens_per_s`: the most streamed chunks in one second since the first request was sent;
  `max_concurrent_requests`: the most requests active in one such second.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the load generator load only when a result is made: `bench --help` stays fast
    from pdtop.bench.loadgen import LoadSpec
    from pdtop.bench.openai_request import RequestResult

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
_TITLES = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
           "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency"),
           "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
           "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency")}


def percentile_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _peaks(done: list[RequestResult]) -> tuple[float, int]:
    """(most chunks streamed in one second, most requests active in one second), as vLLM 0.33 counts them:
    seconds since the first completed request was sent, a request active in each second it spans."""
    import numpy as np

    if not done:
        return 0.0, 0
    first = min(r.start_time for r in done)
    seconds = int(np.ceil(max(r.start_time + r.latency for r in done) - first)) + 1
    per_second, active = np.zeros(seconds), np.zeros(seconds)
    for r in done:
        t = r.start_time + r.ttft
        for gap in [0.0, *r.itls]:
            t += gap
            if 0 <= int(t - first) < seconds:
                per_second[int(t - first)] += 1
        active[int(r.start_time - first):int(r.start_time + r.latency - first) + 1] += 1
    return float(per_second.max()), int(active.max())


def reported_metrics(spec: LoadSpec, metrics: tuple[str, ...]) -> tuple[str, ...]:
    """The chosen metrics vLLM 0.33 reports for this run, in its order (the client-queue two need
    --max-concurrency, the queue-inclusive E2EL also a finite --request-rate)."""
    queued = spec.max_concurrency is not None
    possible = {"client_queue_time": queued, "e2el_including_client_queue": queued and spec.request_rate < math.inf}
    return tuple(m for m in PERCENTILE_METRICS if m in metrics and possible.get(m, True))


def result_json(spec: LoadSpec, results: list[RequestResult], duration: float, *, date: str,
                tokenizer_id: str, label: str | None = None, metrics: tuple[str, ...] = ("ttft", "tpot", "itl"),
                percentiles: tuple[float, ...] = (99.0,), detailed: bool = False,
                metadata: tuple[tuple[str, str], ...] = (), rps_changes: list[dict[str, Any]] | None = None,
                ) -> dict[str, Any]:
    """The object vLLM's `--save-result` writes, key for key, in its order (`main_async`: setup, metadata,
    traffic, then `benchmark`'s result merged over them)."""
    import numpy as np

    from pdtop.bench.loadgen import metric_values

    done = [r for r in results if r.ok]
    output_lens = [r.output_tokens if r.ok else 0 for r in results]
    total_in, total_out = sum(r.prompt_tokens for r in done), sum(output_lens)
    good = sum(r.meets(spec.goodput) for r in done) / duration if spec.goodput else None
    peak_tokens, peak_requests = _peaks(done)
    out: dict[str, Any] = {
        "date": date, "endpoint_type": spec.backend, "backend": spec.backend, "label": label,
        "model_id": spec.model_id or spec.model, "tokenizer_id": tokenizer_id, "num_prompts": spec.num_prompts,
    }
    out.update(metadata)
    out["request_rate"] = spec.request_rate if spec.request_rate < math.inf else "inf"
    out["burstiness"] = spec.burstiness
    out["max_concurrency"] = spec.max_concurrency
    if spec.ramp_up is not None:
        out["ramp_up_strategy"], out["ramp_up_start_rps"], out["ramp_up_end_rps"] = spec.ramp_up
    figures: dict[str, Any] = {
        "duration": duration, "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration, "request_goodput": good,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [r.prompt_tokens for r in results], "output_lens": output_lens,
        "ttfts": [r.ttft for r in results], "itls": [r.itls for r in results],
        "latencies": [r.latency for r in results], "start_times": [r.start_time for r in results],
        "queue_times": [r.queue_time for r in results], "generated_texts": [r.text for r in results],
        "errors": [r.error for r in results],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests, "rtfx": 0.0,
    }
    if rps_changes:
        figures["rps_change_events"] = rps_changes
    values = metric_values(results)
    for name in reported_metrics(spec, metrics):
        v = values[name] or [0.0]
        figures[f"mean_{name}_ms"] = float(np.mean(v)) * 1e3
        figures[f"median_{name}_ms"] = float(np.median(v)) * 1e3
        figures[f"std_{name}_ms"] = float(np.std(v)) * 1e3
        for p in percentiles:
            figures[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(v, p)) * 1e3
    out.update(figures)
    if not detailed:
        for name in DETAILED_FIELDS:
            out.pop(name, None)
    return out


def result_table(result: dict[str, Any], metrics: tuple[str, ...], percentiles: tuple[float, ...]) -> str:
    """The result as `vllm bench serve` prints it; `metrics`: those reported (`reported_metrics`)."""
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
              f"{'Peak concurrent requests:':<40} {r['max_concurrent_requests']:<10.2f}"]
    if r["rtfx"] > 0:
        lines.append(f"{'RTFx (Inverse Real-Time Factor):':<40} {r['rtfx']:<10.2f}")
    lines.append(f"{'Total token throughput (tok/s):':<40} {r['total_token_throughput']:<10.2f}")
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


def result_filename(spec: LoadSpec, label: str | None, date: str, filename: str | None,
                    result_dir: str | None) -> str:
    """vLLM 0.33's `compute_result_filename`: `filename`, or `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`
    (a ramp-up: `{label}-ramp-up-{strategy}-{start}qps-{end}qps...`; label: the backend unless given), under
    `result_dir`."""
    model = str(spec.model_id or spec.model).split("/")[-1]
    concurrency = f"-concurrency{spec.max_concurrency}" if spec.max_concurrency is not None else ""
    label = label or spec.backend
    if spec.ramp_up is not None:
        strategy, start, end = spec.ramp_up
        name = f"{label}-ramp-up-{strategy}-{start}qps-{end}qps{concurrency}-{model}-{date}.json"
    else:
        name = f"{label}-{spec.request_rate}qps{concurrency}-{model}-{date}.json"
    name = filename or name
    return os.path.join(result_dir, name) if result_dir else name
