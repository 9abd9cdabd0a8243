"""A `/metrics` page -> the samples pdtop reads, parsed by prometheus_client's parser.

Only the lines of metrics pdtop reads (`names.ENGINES`) reach the parser: a server's page also holds
Python's GC and process metrics, HTTP handler histograms and many request-size histograms, and
parsing those every second would cost more than everything else together. Anything that is not such a
page raises `PageError`, whose message says in one line what the page is instead.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pdtop.telemetry.scrape.disagg import sample_names
from pdtop.telemetry.scrape.names import ENGINES
from pdtop.visible import visible

PREFIXES = {engine: engine + ":" for engine in ENGINES}  # vllm: sglang: pdtop:
_SNIFF_CHARS = 1 << 16  # how much of an unknown page is parsed to say what it is
# Parsed names and labels are kept for the next read, bounded in bytes: a page whose labels change on every
# read (a hostile or broken exporter) would otherwise fill any count of entries with lines of any length.
# 16 MiB keeps every series of 256 fleet servers' pages (15-100 KiB each) or one 2,000-series vLLM page many
# times over; past it the cache starts again (parsing costs about 0.1 s a MiB, the cache saves most of it).
MAX_SERIES_CACHE_BYTES = 16 << 20
MAX_CACHED_LINE = 4 << 10  # a longer `name{labels}` is parsed each time, not kept
_ENTRY_BYTES = 600  # what a kept series costs beside its text: the objects of its key, name, labels (getsizeof)


class _SeriesCache:
    """`name{labels}` text -> (sample name, labels), with what it holds counted in bytes."""

    def __init__(self) -> None:
        self.series: dict[str, tuple[str, dict[str, str]]] = {}
        self.bytes = 0

    def put(self, key: str, name: str, labels: dict[str, str]) -> None:
        if len(key) > MAX_CACHED_LINE or key in self.series:
            return
        cost = 2 * len(key) + _ENTRY_BYTES  # the key, and the label strings parsed out of it
        if self.bytes + cost > MAX_SERIES_CACHE_BYTES:
            self.series.clear()
            self.bytes = 0
        self.series[key] = (name, labels)
        self.bytes += cost


_SERIES = _SeriesCache()


class PageError(ValueError):
    """Not a page of a serving engine pdtop reads; the message says what it is, in one line."""


@dataclass
class Page:
    engine: str  # "vllm" | "sglang" | "pdtop"
    models: list[str]  # `model_name` label values, in order of first appearance
    samples: list[Sample]  # of the metrics pdtop reads, every model


def read_page(text: str, content_type: str = "") -> Page:
    engine = detect_engine(text)
    if engine is None:
        raise PageError(what_it_is(text, content_type))
    wanted = _sample_names(engine)
    lines = [line for line in text.splitlines() if line.partition("{")[0].partition(" ")[0] in wanted]
    samples = _parse(lines)
    models = list(dict.fromkeys(s.labels["model_name"] for s in samples if "model_name" in s.labels))
    return Page(engine, models, samples)


def _parse(lines: list[str]) -> list[Sample]:
    """The lines' samples, by prometheus_client's parser; a line whose name and labels were parsed before
    (a server's series are the same every read) only has its value read, which is most of the cost."""
    out: list[Sample | None] = []
    fresh: list[tuple[int, str, str | None]] = []  # (index, line, its cache key)
    for line in lines:
        key, value = _split(line)
        known = _SERIES.series.get(key) if key is not None else None
        if known is not None:
            try:
                out.append(Sample(known[0], known[1], float(value)))
                continue
            except ValueError:
                pass
        fresh.append((len(out), line, key))
        out.append(None)
    if fresh:
        try:
            parsed = [s for family in text_string_to_metric_families("\n".join(line for _, line, _ in fresh) + "\n")
                      for s in family.samples]
        except (ValueError, IndexError, KeyError, TypeError) as exc:  # what the parser raises on bad lines
            raise PageError(f"not valid Prometheus text: {_one_line(exc)}") from None
        if len(parsed) != len(fresh):  # (never seen: a line is one sample) keep the parser's word for it
            return parsed
        for (i, _, key), sample in zip(fresh, parsed, strict=True):
            out[i] = sample
            if key is not None:
                _SERIES.put(key, sample.name, sample.labels)
    return [s for s in out if s is not None]


def _split(line: str) -> tuple[str | None, str]:
    """`name{labels}` and the value text of a sample line; no key where a `}` could be inside a label's
    value (then the parser reads the whole line)."""
    if "{" in line:
        if line.count("}") != 1:
            return None, ""
        end = line.index("}") + 1
    else:
        end = line.find(" ")
        if end < 0:
            return None, ""
    rest = line[end:].split()
    return (line[:end], rest[0]) if rest else (None, "")


def detect_engine(text: str) -> str | None:
    """The engine whose prefix starts the most lines, if any does."""
    counts = {engine: text.startswith(p) + text.count("\n" + p) for engine, p in PREFIXES.items()}
    engine = max(counts, key=lambda e: counts[e])
    return engine if counts[engine] else None


def what_it_is(text: str, content_type: str) -> str:
    """Why a page holds no metrics pdtop reads, in one line."""
    if content_type.split(";")[0].strip().lower() == "text/html" or text.lstrip()[:1] == "<":
        return "an HTML page, not Prometheus metrics (a login page, or a proxy in the way?)"
    if not text.strip():
        return "an empty page"
    head = text[:_SNIFF_CHARS]
    head = head[:head.rfind("\n") + 1] or head + "\n"
    try:
        series = sum(len(family.samples) for family in text_string_to_metric_families(head))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        return f"not Prometheus text ({_one_line(exc)})"
    names = ", ".join(PREFIXES.values())
    return f"Prometheus text with {series}{'+' if len(head) < len(text) else ''} series, but none named {names}" \
        " so not a serving engine pdtop reads"


@functools.cache
def _sample_names(engine: str) -> frozenset[str]:
    """The sample names pdtop reads of an engine's page (a line's name is what stands before its `{` or
    its first space: one set lookup a line, where testing each name's beginning cost one test a name)."""
    names = set(sample_names())
    for figure in ENGINES[engine]:
        for name in figure.names:
            names.update(figure.sample_names(name))
    return frozenset(names)


def _one_line(exc: BaseException) -> str:
    """The parser's word, which quotes the page: its first line, cut, control characters made visible."""
    return visible((str(exc).splitlines() or [type(exc).__name__])[0], 100)
