"""A candidate's score: requests that meet every SLO, on an engine (the p99 of each request's ITLs) and
over HTTP (each request's TPOT, as vLLM's goodput counts it), and the time prompts waited."""
from __future__ import annotations

import itertools

import pytest

from pdtop.tune.score import HttpSample, RequestSample, Slo, covered_s, score


def test_score_counts_requests_that_meet_every_slo():
    slo = Slo(itl_s=0.010, ttft_s=0.5)
    samples = [
        RequestSample(None, [0.008] * 50),  # arrived before the window: only ITL counts
        RequestSample(None, [0.008] * 98 + [0.030] * 2),  # p99 over the SLO
        RequestSample(0.4, [0.009, 0.009]),
        RequestSample(0.6, []),  # TTFT over
    ]
    m = score(samples, slo, window_s=2.0, prompt_tokens=8192, prefill_wait_s=0.5, decode_only_itl_s=0.007)
    assert (m.good, m.requests) == (2, 4) and m.goodput_rps == 1.0
    assert m.prefill_tok_s == 8192 / 0.5 and m.ttft_p99_s <= 0.6
    assert m.itl_p99_s > 0.010 and not slo.met(m)


def test_covered_time_counts_overlaps_once():
    assert covered_s([(0, 1), (0.5, 2), (3, 4)]) == 3.0
    assert covered_s([]) == 0.0
    assert covered_s(itertools.repeat((1.0, 2.0), 3)) == 1.0


def test_the_score_is_per_request_tpot_not_its_worst_gap():
    """One long stall in a request of many tokens: its p99 gap misses the SLO, its TPOT meets it
    (vLLM's goodput counts TPOT), so the request is good."""
    gaps = [0.01] * 98 + [0.5]
    s = HttpSample(long=False, sent_s=0.0, ttft_s=0.1, latency_s=0.1 + sum(gaps), output_tokens=100,
                   prompt_tokens=16, itls_s=gaps)
    assert s.tpot_s == pytest.approx(sum(gaps) / 99)
    assert s.good(Slo(0.02, 1.0))
    assert not s.good(Slo(0.014, 1.0)) and not s.good(Slo(0.02, 0.05))
