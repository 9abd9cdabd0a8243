"""The workload generator: seeded Poisson arrivals, length ranges, injection, pause, real text."""
from __future__ import annotations

import itertools
import statistics

from pdtop.engine.scheduling.workload import PromptMaker, Workload, WorkloadSpec, corpus_text


def test_arrivals_are_seeded_poisson_within_the_ranges():
    spec = {"rate": 50.0, "prompt_tokens": (10, 20), "output_tokens": (3, 5)}
    a = Workload(WorkloadSpec(seed=3, **spec)).due(100.0)
    b = Workload(WorkloadSpec(seed=3, **spec)).due(100.0)
    c = Workload(WorkloadSpec(seed=4, **spec)).due(100.0)
    assert a == b and a != c
    assert 4500 < len(a) < 5500  # 50/s for 100 s
    gaps = [y.time - x.time for x, y in itertools.pairwise(a)]
    assert abs(statistics.mean(gaps) - 0.02) < 0.002 and abs(statistics.stdev(gaps) - 0.02) < 0.003  # exponential
    assert all(10 <= r.prompt_tokens <= 20 and 3 <= r.max_tokens <= 5 for r in a)
    assert [r.time for r in a] == sorted(r.time for r in a)


def test_due_returns_each_arrival_once():
    w = Workload(WorkloadSpec(rate=10.0, seed=1))
    first, second = w.due(5.0), w.due(10.0)
    assert first and second and first[-1].time <= 5.0 < second[0].time


def test_inject_pause_resume_and_rate():
    w = Workload(WorkloadSpec(rate=10.0, long_prompt_tokens=4096, seed=1))
    w.pause()
    w.inject(1.0)
    got = w.due(50.0)
    assert len(got) == 1 and got[0].injected and got[0].prompt_tokens == 4096  # injection ignores pause
    w.resume(50.0)
    assert w.due(100.0)
    w.set_rate(0.0, 100.0)
    assert w.due(1e6) == []


def test_prompts_are_windows_of_real_text():
    words = corpus_text().split()
    assert len(words) > 500
    maker = PromptMaker(lambda text: [ord(ch) for ch in text], seed=0)
    for n in (1, 50, 10_000):  # longer than the corpus: wraps around
        ids = maker.make(n)
        assert len(ids) == n
        assert "".join(map(chr, ids[:40])) in corpus_text() * 3
