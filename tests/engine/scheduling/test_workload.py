"""The workload generator: seeded Poisson arrivals, length ranges, injection, pause, real text."""
from __future__ import annotations

import itertools
import statistics

from pdtop.engine.scheduling.workload import DEMO, PromptMaker, Workload, WorkloadSpec, corpus_text, demo_workload


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
    got = [w.inject(1.0), *w.due(50.0)]  # an injection is not one of the workload's arrivals: pause leaves it
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


def test_closed_loop_keeps_its_requests_in_flight_at_most_its_count_a_second():
    w = Workload(WorkloadSpec(rate=0.0, concurrency=4, seed=1))
    assert [a.kind for a in w.due(0.0)] == ["loop"] * 4  # the whole batch at the start
    assert w.due(0.5, in_flight=4) == []  # full
    assert len(w.due(0.6, in_flight=0)) == 3  # all four finished: one every quarter second since 0 s
    assert len(w.due(0.7, in_flight=3)) == 0
    assert len(w.due(0.75, in_flight=3)) == 1
    assert len(w.due(100.0, in_flight=0)) == 4  # never more than one second's worth at once


def test_long_prompts_come_periodically_but_never_pile_up():
    w = Workload(WorkloadSpec(rate=0.0, long_every_s=3.0, long_prompt_tokens=8192, output_tokens=(5, 9), seed=1))
    assert w.due(2.9) == []
    got = w.due(3.0)
    assert len(got) == 1 and got[0].kind == "long" and got[0].prompt_tokens == 8192 and 5 <= got[0].max_tokens <= 9
    assert w.due(6.5, long_waiting=True) == []  # the one due at 6 s is skipped: the last still waits
    assert w.due(8.9) == []  # and the next is due at 9 s, not at once
    assert [a.kind for a in w.due(9.0)] == ["long"]


def test_scenario_is_seeded_and_described_in_one_line():
    def run(seed: int) -> list:
        w = Workload(demo_workload("sim", seed=seed))
        return [w.due(t / 10, in_flight=min(48, t)) for t in range(100)]

    assert run(0) == run(0) != run(1)
    spec = demo_workload("cpu", rate=1.5)
    assert spec.rate == 1.5 and spec.concurrency == DEMO["cpu"].concurrency and DEMO["cpu"].rate == 0
    line = spec.describe()
    assert "\n" not in line and "decode batch 8" in line and "1024-token prompts every 5 s" in line
    assert "1.5 req/s Poisson" in line and line.endswith("seed 0")
    assert WorkloadSpec(rate=2.0).describe() == "2 req/s Poisson (prompts 32-256, outputs 32-128 tokens); seed 0"
