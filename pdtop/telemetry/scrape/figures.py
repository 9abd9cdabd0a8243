"""One scrape of a page -> its `metrics` event, for one model.

Gauges are read as they are now, counters as rates and histograms as percentiles over the window
(`Window`); series of the model that differ in other labels (vLLM's `engine` index, SGLang's ranks)
are summed, or averaged for fractions, as `sum by (le)` / `avg` would in PromQL.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from prometheus_client.samples import Sample

from pdtop.telemetry.events import Metrics, Quantiles
from pdtop.telemetry.scrape.disagg import counters as disagg_counters
from pdtop.telemetry.scrape.disagg import disagg
from pdtop.telemetry.scrape.names import ENGINES, FIELDS, HISTOGRAM, MEAN, RATE, SUM, Figure
from pdtop.telemetry.scrape.page import Page
from pdtop.telemetry.scrape.quantile import histogram_quantile
from pdtop.telemetry.scrape.window import Key, Window

QUANTILES = (0.5, 0.9, 0.99)  # p50_s, p90_s, p99_s


def figures(page: Page, model: str | None, window: Window, t: float) -> tuple[Metrics, int]:
    """The `metrics` event for `model` (None: every series), and how many counter series went back
    since the previous scrape (a restart). A figure the page lacks is left out of the event (`absent`),
    and so is the last read's ITL p50 without the ITL."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for s in page.samples:
        if model is None or s.labels.get("model_name") == model:
            by_name[s.name].append(s)
    chosen: list[tuple[Figure, list[Sample]]] = []
    for figure in ENGINES[page.engine]:
        for name in figure.names:
            samples = [s for sample_name in figure.sample_names(name) for s in by_name.get(sample_name, ())]
            if samples:
                chosen.append((figure, samples))
                break
    counters = {_key(s): s.value for figure, samples in chosen if figure.how in (RATE, HISTOGRAM) for s in samples}
    counters |= disagg_counters(by_name, _key)
    resets = window.add(t, counters)
    span = window.span_s
    out: dict[str, Any] = {"time": t, "window_s": span}
    for figure, samples in chosen:
        if figure.how == SUM:
            out[figure.field] = finite(sum(s.value for s in samples))
        elif figure.how == MEAN:
            out[figure.field] = finite(sum(s.value for s in samples) / len(samples))
        elif figure.how == RATE:
            out[figure.field] = finite(sum(window.increase(_key(s)) for s in samples) / span) if span > 0 else None
        else:
            out[figure.field] = quantiles(window, samples)
            if figure.field == "itl":
                out["itl_read_p50_s"] = quantiles(window, samples, last=True).p50_s
    role = next((s.labels["engine_type"] for s in page.samples if "engine_type" in s.labels
                 and (model is None or s.labels.get("model_name") == model)), None)
    return Metrics(**out, not_exposed=[f for f in FIELDS if f not in out], role=role,
                   disagg=disagg(by_name, window, _key, quantiles, finite),
                   absent=frozenset(f for f in (*FIELDS, "itl_read_p50_s") if f not in out)), resets


def quantiles(window: Window, buckets: list[Sample], last: bool = False) -> Quantiles:
    """A histogram's `Quantiles` over the window, from the increase of each bucket summed by `le`
    (`last`: over the time since the previous scrape alone)."""
    increase = window.increase_last if last else window.increase
    by_bound: dict[float, float] = defaultdict(float)
    for s in buckets:
        try:
            bound = float(s.labels.get("le", "nan"))
        except ValueError:
            continue
        if not math.isnan(bound):
            by_bound[bound] += increase(_key(s))
    pairs = sorted(by_bound.items())
    first = next((b for b, _ in pairs if 0 < b < math.inf), None)
    count = by_bound.get(math.inf, math.nan)
    if not all(math.isfinite(c) for _, c in pairs) or not math.isfinite(count):
        return Quantiles(finite(count), "NaN", "NaN", "NaN", first)
    if count == 0:
        return Quantiles(0.0, None, None, None, first)
    p50, p90, p99 = (finite(histogram_quantile(q, pairs)) for q in QUANTILES)
    return Quantiles(count, p50, p90, p99, first)


def finite(value: float) -> float | str:
    """A finite number as it is; NaN and the infinities as the words the events use for them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _key(s: Sample) -> Key:
    return s.name, tuple(sorted(s.labels.items()))
