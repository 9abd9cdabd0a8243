"""Waiting-queue caps, thread-safe submission, abort and stop: on a simulated GPU (fast, deterministic)."""
from __future__ import annotations

import gc
import logging
import threading
import tracemalloc

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.description import Limits
from pdtop.engine.errors import ControlError, QueueFullError
from pdtop.engine.records import RequestRecord, RoundRecord
from pdtop.engine.request import SamplingParams
from pdtop.engine.scheduling.admission import QueueLimits
from pdtop.engine.scheduling.commands import Inject
from pdtop.engine.scheduling.workload import WorkloadSpec


def _finishes(records, reason, source=None):
    return [r for r in records if isinstance(r, RequestRecord) and r.kind == "finish" and r.finish_reason == reason
            and (source is None or r.source == source)]


def test_a_flood_of_long_injects_is_capped_and_memory_stays_bounded():
    """Issue 10: 2,000 injects of 40,959 tokens took a server from 28 to 593 MB. With the default caps
    the queue holds a few of them; the rest are refused at once (an error reply), each reported as a
    rejected request."""
    engine = build_engine("sim:H100", workload=WorkloadSpec(rate=0))
    records: list = []
    engine.add_sink(records.append)
    inject = Inject(engine.max_prompt)
    assert engine.max_prompt == 40959
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        asked = [engine.control(inject) for _ in range(2000)]  # in one tick
        engine.step()  # the round boundary: each arrives in turn, through the caps, or is refused
        refused = 0
        for outcome in asked:
            exc = outcome.exception(0)
            if exc is not None:
                assert isinstance(exc, ControlError) and exc.field == "inject" and "waiting queue full" in exc.reason
                refused += 1
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert grown < 20e6, f"{grown / 1e6:.0f} MB held by queued prompts"
        limits = engine.describe().limits
        s = engine.scheduler  # on a GPU a prefill with nothing decoding runs whole in its round: then it decodes
        kept = len(s.waiting) + (s.active.batch is not None) + len(s.running)
        assert kept == 2000 - refused and kept * 40959 <= limits.max_waiting_tokens
        assert len(_finishes(records, "rejected", "inject")) == limits.refused["inject"] == refused
    finally:
        engine.close()


def test_synthetic_arrivals_over_the_cap_are_dropped_and_counted():
    limits = QueueLimits(max_waiting_requests=20, max_waiting_tokens=100_000)
    engine = build_engine("sim:H100", workload=WorkloadSpec(rate=1000, seed=3), limits=limits)
    records: list = []
    engine.add_sink(records.append)
    try:
        rounds = [engine.step() for _ in range(400)]
        assert max(r.waiting for r in rounds) <= 20
        dropped = engine.describe().limits.refused["workload"]
        assert dropped > 0 and dropped == len(_finishes(records, "rejected", "workload"))
        arrivals = [r for r in records if isinstance(r, RequestRecord) and r.kind == "arrival"]
        assert {r.source for r in arrivals} == {"workload"}
    finally:
        engine.close()


def test_enqueue_from_another_thread_streams_tokens_and_counts_toward_the_cap():
    engine = build_engine("sim:H100", limits=QueueLimits(max_waiting_requests=3))
    updates: list = []
    try:
        reqs = [engine.enqueue([1] * 100, SamplingParams(max_tokens=5, ignore_eos=True), on_update=updates.append)
                for _ in range(3)]
        with pytest.raises(QueueFullError, match="max_waiting_requests 3"):
            engine.enqueue([1] * 100, SamplingParams(max_tokens=5))
        assert engine.describe().limits.refused["api"] == 1
        assert engine.scheduler.idle() and not engine.idle()  # queued for the next round boundary
        stepper = threading.Thread(target=lambda: [engine.step() for _ in range(40)])  # the engine's own thread
        stepper.start()
        stepper.join(30)
        assert all(r.finished and r.finish_reason == "length" and r.source == "api" for r in reqs)
        tokens = sum(len(u.tokens) for u in updates)
        assert tokens == 15 and sorted(u.finish_reason for u in updates if u.finish_reason) == ["length"] * 3
    finally:
        engine.close()


def test_abort_frees_kv_at_the_next_boundary_and_stops_an_abandoned_prefill():
    """Issue 27 §2 item 4: an aborted 8,191-token prefill ran to its end (one layer per round on cpu,
    over 100 s); now no slice of it is submitted after the abort, and it ends once none is running."""
    engine = build_engine("sim:H100")
    records: list = []
    engine.add_sink(records.append)
    finals: list = []
    try:
        decoding = engine.enqueue([1] * 64, SamplingParams(max_tokens=1000, ignore_eos=True),
                                  on_update=lambda u: finals.append(u) if u.finish_reason else None)
        while len(decoding.output_ids) < 3:
            engine.step()
        long = engine.enqueue([1] * 8192, SamplingParams(max_tokens=1000, ignore_eos=True))
        engine.step()
        batch = engine.scheduler.active.batch
        assert batch is not None and long in batch.reqs
        submitted = batch.submitted_end
        engine.abort(decoding)
        engine.abort(long)
        engine.step()
        assert decoding.finish_reason == "abort" and not decoding.table.blocks
        assert finals and finals[-1].finish_reason == "abort"
        for _ in range(3):  # the slice in flight at the abort finishes; no other starts
            engine.step()
        assert long.finish_reason == "abort" and long.output_ids == [] and engine.scheduler.active.batch is None
        assert submitted < engine.executor.cfg.num_layers  # the prefill did not run to its end
        assert engine.executor.kv_usage()[0] == 0
        assert {r.request_id for r in _finishes(records, "abort")} == {decoding.id, long.id}
    finally:
        engine.close()


def test_on_update_returning_true_ends_the_request_before_another_token():
    engine = build_engine("sim:H100")
    records: list = []
    engine.add_sink(records.append)
    try:
        req = engine.enqueue([1] * 32, SamplingParams(max_tokens=100, ignore_eos=True),
                             on_update=lambda u: len(u.tokens) > 0)
        for _ in range(5):
            engine.step()
        assert req.finish_reason == "stop" and len(req.output_ids) == 1
        finish = _finishes(records, "stop")
        assert len(finish) == 1 and finish[0].output_tokens == 1 and finish[0].source == "api"
        assert isinstance(records[-1], RoundRecord) and engine.executor.kv_usage()[0] == 0
    finally:
        engine.close()


def test_limits_are_checked_and_described():
    with pytest.raises(Exception, match="max_waiting_tokens: must be an integer >= 1"):
        QueueLimits(max_waiting_tokens=0)
    engine = build_engine("sim:H100", limits=QueueLimits(7, 7000))
    try:
        assert engine.describe().limits == Limits(max_waiting_requests=7, max_waiting_tokens=7000,
                                                  refused={"workload": 0, "inject": 0, "api": 0})
    finally:
        engine.close()


def test_a_sink_that_raises_neither_stops_the_engine_nor_the_other_sinks(caplog):
    engine = build_engine("sim:H100", workload=WorkloadSpec(rate=20.0, seed=1))
    seen: list = []

    def broken(record) -> None:
        raise RuntimeError("a broken watcher")

    engine.add_sink(broken)
    engine.add_sink(seen.append)
    with caplog.at_level(logging.WARNING, logger="pdtop.engine"):
        for _ in range(40):
            engine.step()
    assert sum(isinstance(r, RoundRecord) for r in seen) == 40
    failures = [r for r in caplog.records if "sink" in r.getMessage()]
    assert 1 <= len(failures) <= 8  # once with the traceback, then at powers of two: quiet under a flood
    assert "a broken watcher" in caplog.text
    engine.remove_sink(broken)
    assert engine.sinks.all == (seen.append,)
    engine.close()
