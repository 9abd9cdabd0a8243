"""The dashboard state model, fed events as the server sends them (docs/protocol.md)."""
from __future__ import annotations

import dataclasses

import pytest

from pdtop.telemetry.events import ErrorNotice, Hello
from pdtop.ui.state import DashboardState
from pdtop.ui.window_figures import (
    bandwidth,
    level_rows,
    level_stats,
    output_throughput,
    step_series,
    step_summary,
)


def test_hello_fills_engine_info_and_config(ev):
    s = DashboardState()
    assert isinstance(s.ingest(ev.hello), Hello)
    assert s.hello and s.client_id == "c1" and not s.readonly
    assert s.info.device == "sim:H100" and s.info.units == 132 and s.info.unit_name == "SMs"
    assert s.levels[4] == (88, 44) and len(s.levels) == 8
    assert s.info.peak_bytes_per_s == 3.35e12
    assert s.config is not None and s.config.decode_bs_divisor == 36 and s.policy == "pdmux"


def test_rounds_give_split_itl_bandwidth_and_throughput(ev):
    s = DashboardState()
    s.ingest(ev.hello)
    steps = [0.010, 0.012, 0.011, 0.050, 0.010]
    t = 0.0
    for i, step in enumerate(steps):
        t += step
        s.ingest(ev.round(i, t, step=step))
    s.ingest(ev.round(5, t + 0.02, step=0.02, bs=0))  # a prefill-only round: not a decode step
    assert (s.level, s.prefill_units, s.decode_units) == (4, 88, 44)
    p50, p99, worst = step_summary(s.window())
    # sorted 10, 10, 11, 12, 50 ms: p99 sits 0.96 of the way from 12 to 50 (linear, numpy's default)
    assert p50 == pytest.approx(0.011) and p99 == pytest.approx(0.012 + 0.96 * 0.038) and worst == 0.050
    avg, last = bandwidth(s.window())
    assert avg == pytest.approx(6 * 2e10 / (sum(steps) + 0.02))
    assert last == pytest.approx(2e10 / 0.02)
    assert output_throughput(s.window()) == pytest.approx(24 / (sum(steps) + 0.02))  # back to back: elapsed = busy
    assert s.kv_usage == 0.5 and s.running == 0 and s.waiting == 1


def test_output_throughput_is_tokens_over_elapsed_time_not_busy_time(ev):
    """vLLM's output throughput: an engine that waits between rounds has a lower one."""
    s = DashboardState()
    for i, t in enumerate((1.0, 1.5, 2.0)):  # 10 ms rounds, 0.5 s apart
        s.ingest(ev.round(i, t, step=0.01, tokens=5))
    assert output_throughput(s.window()) == pytest.approx(15 / (0.01 + 0.5 + 0.5))
    s.ingest(ev.round(10, 2.01, step=0.01, tokens=5))  # rounds 3..9 missed: only this round's own time is known
    assert output_throughput(s.window()) == pytest.approx(20 / (0.01 + 1.0 + 0.01))


def test_step_series_buckets_take_the_worst_step(ev):
    s = DashboardState(window_s=1.0)
    s.ingest(ev.hello)
    for i in range(100):
        s.ingest(ev.round(i, (i + 1) * 0.01, step=0.05 if i == 50 else 0.01))
    series = step_series(s.window(), s.slices(10), 10)
    assert len(series) == 10 and max(v for v in series if v is not None) == 0.05
    assert sum(1 for v in series if v == 0.05) == 1


def test_window_is_engine_time(ev):
    s = DashboardState(window_s=1.0)
    for i in range(300):
        s.ingest(ev.round(i, i * 0.01))
    window = s.window()
    assert window[-1].time == pytest.approx(2.99)
    assert window[0].time >= 2.99 - 1.0 > s.rounds[-len(window) - 1].time
    assert 100 <= len(window) <= 101


def test_prefill_eta_from_layers_per_round_and_from_progress(ev):
    s = DashboardState()
    for i in range(4):
        s.ingest(ev.round(i, (i + 1) * 0.01, prefills=[ev.prefill([7], 8 * i)]))
    (p,) = s.prefills
    assert p.request_ids == [7] and p.layers_done == 24 and p.layers_total == 36
    assert p.eta_s == pytest.approx(2 * 0.01)  # 12 layers left at 8 a round, 10 ms rounds
    # chunked prefill reports no k: the ETA comes from observed progress
    s.ingest(ev.round(4, 0.05, prefills=[ev.prefill([9], 9, k=0)]))
    assert s.prefills[0].eta_s is None
    s.ingest(ev.round(5, 0.06, prefills=[ev.prefill([9], 18, k=0)]))
    assert s.prefills[0].eta_s == pytest.approx(0.02)


def test_a_pdmux_chunks_eta_counts_the_chunks_after_it(ev):
    """pdmux with chunked_prefill_size 2048: an 8192-token prompt's second chunk, 8 of its 36 layers done at 8
    a round: 4 rounds left of it (36 = 4 x 8 + 4), then 2 chunks of 5 rounds each, at 10 ms a round. On the
    wire `layers_done` is the prompt's share done: (2048 x 36 + 2048 x 8) / 8192 = 11 of 36."""
    s = DashboardState()
    ev.hello["engine"]["config"]["chunked_prefill_size"] = 2048  # on the wire only when set
    s.ingest(ev.hello)
    chunk = dataclasses.replace(ev.prefill([7], 11), tokens_done=2048)
    for i in range(3):
        s.ingest(ev.round(i, (i + 1) * 0.01, prefills=[chunk]))
    assert s.prefills[0].tokens_done == 2048 and s.prefills[0].eta_s == pytest.approx((4 + 2 * 5) * 0.01)
    last = dataclasses.replace(chunk, tokens_done=6144, layers_done=29)  # the last chunk, 8 of its layers done
    s.ingest(ev.round(3, 0.04, prefills=[last]))
    assert s.prefills[0].eta_s == pytest.approx(4 * 0.01)


def test_requests_give_ttft_itl_and_tpot(ev):
    s = DashboardState()
    for i in range(100):
        s.ingest(ev.request("arrival", i))
        s.ingest(ev.request("first_token", i, 0.1, output_tokens=1, ttft_s=(i + 1) / 1000))
    s.ingest(ev.request("finish", 0, 1.0, output_tokens=4, ttft_s=0.001, itls_s=[0.01, 0.02, 0.03],
                        finish_reason="length"))
    s.ingest(ev.request("finish", 1, 1.0, output_tokens=3, ttft_s=0.002, itls_s=[0.1, 0.1], finish_reason="eos"))
    s.ingest(ev.request("finish", 2, 1.0, finish_reason="rejected"))
    assert s.arrivals == 100 and s.first_tokens == 100 and s.finished == 2 and s.rejected == 1
    # 1..100 ms: p50 halfway between 50 and 51 ms, p99 at 99.01 ms (positions 49.5 and 98.01)
    assert s.ttft_summary() == pytest.approx((0.0505, 0.09901))
    # TPOT: one value per finished request, its mean gap (20, 100 ms); ITL comes from the rounds, not from these
    assert s.tpot_summary() == pytest.approx((0.06, 0.0992))
    assert s.itl_summary() == (None, None, None)
    # ITL: each decode round's gap since the batch's previous tokens, once per request in its batch
    for i, (t, bs) in enumerate([(1.00, 2), (1.01, 2), (1.03, 2), (1.06, 1)]):
        s.ingest(ev.round(i, t, bs=bs))
    assert sorted(s.itls) == pytest.approx([0.01, 0.01, 0.02, 0.02, 0.03])
    assert s.itl_summary() == pytest.approx((0.02, 0.0296, 0.03))


def test_counts_come_from_the_servers_totals(ev):
    """hello's totals seed the counters; a new hello (a restarted server) replaces them; a seek restarts them."""
    s = DashboardState()
    hello = ev.hello
    hello["engine"]["totals"] = {"arrived": 41, "first_token": 40, "finished": 33, "rejected": 2}
    s.ingest(hello)
    s.ingest(ev.request("arrival", 42))
    assert (s.arrivals, s.first_tokens, s.finished, s.rejected) == (42, 40, 33, 2)
    assert s.counts_since == "engine start"
    hello["engine"]["totals"] = {"arrived": 3, "first_token": 1, "finished": 0, "rejected": 0}
    s.ingest(hello)
    assert (s.arrivals, s.first_tokens, s.finished, s.rejected) == (3, 1, 0, 0)
    del hello["engine"]["totals"]  # a server older than the field: counted from this connection
    s.ingest(hello)
    assert (s.arrivals, s.finished, s.counts_since) == (0, 0, "connect")
    s.ingest(ev.request("arrival", 1))
    s.ingest({"type": "seek", "v": 1, "position": 3.0, "config": ev.hello["engine"]["config"]})
    assert (s.arrivals, s.counts_since) == (0, "seek")


def test_itl_and_time_share_per_level(ev):
    """Per level: its share of engine time, and the decode batch's token gaps in its rounds."""
    s = DashboardState()
    s.ingest(ev.hello)
    t = 0.0
    for i in range(10):  # level 4: 10 ms rounds
        t += 0.010
        s.ingest(ev.round(i, t, step=0.010, level=4))
    for i in range(10, 20):  # level 7: 5 ms rounds
        t += 0.005
        s.ingest(ev.round(i, t, step=0.005, level=7))
    idle = ev.round(20, t + 0.05, step=0.0, bs=0)
    idle.update(waiting=0, running=0)
    s.ingest(idle)
    by_level = {st.level: st for st in level_stats(s.window())}
    assert set(by_level) == {4, 7, None}
    total = 0.1 + 0.05 + 0.05
    assert by_level[4].share == pytest.approx(0.1 / total) and by_level[7].share == pytest.approx(0.05 / total)
    assert by_level[None].share == pytest.approx(0.05 / total) and s.idle
    assert by_level[4].itl_p50_s == pytest.approx(0.010)  # the first round has no gap: 9 gaps of 10 ms
    assert by_level[7].itl_p50_s == pytest.approx(0.005) and by_level[None].itl_p50_s is None
    assert (by_level[7].prefill_units, by_level[7].decode_units) == tuple(ev.levels[7])


def test_itl_spans_rounds_that_did_not_decode_and_restarts_when_the_batch_empties(ev):
    s = DashboardState()
    s.ingest(ev.round(0, 1.00, step=0.01))
    prefill_round = ev.round(1, 1.20, step=0.2, bs=0)  # a whole-device prefill round (prefill-first): decode waits
    prefill_round["running"] = 4
    s.ingest(prefill_round)
    s.ingest(ev.round(2, 1.21, step=0.01))
    assert s.rounds[-1].itl_s == pytest.approx(0.21)
    empty = ev.round(3, 1.22, step=0.01)
    empty["running"] = 0  # the batch finished
    s.ingest(empty)
    joined = ev.round(4, 5.00, step=0.01, bs=0)  # a prefill joins the empty batch: its first tokens now
    joined["running"] = 2
    s.ingest(joined)
    s.ingest(ev.round(5, 5.01, step=0.01))
    assert s.rounds[-1].itl_s == pytest.approx(0.01)
    s.ingest(ev.round(9, 5.05, step=0.01))  # rounds missed: the gap is unknown
    assert s.rounds[-1].itl_s is None


def test_snapshot_keeps_its_picture(ev):
    s = DashboardState()
    s.ingest(ev.hello)
    s.ingest(ev.round(0, 0.01, level=4))
    frozen = s.snapshot()
    for i in range(1, 5):
        s.ingest(ev.round(i, 0.01 * (i + 1), level=7))
    assert frozen.level == 4 and len(frozen.rounds) == 1 and len(frozen.window()) == 1
    assert s.level == 7 and len(s.rounds) == 5


def test_config_event_replaces_config_and_levels(ev):
    s = DashboardState()
    s.ingest(ev.hello)
    new_levels = [[132, 0], [112, 20], [96, 36], [0, 132]]
    s.ingest(ev.config(1.0, 10, "c2", manual_divisions=[[112, 20, 1], [96, 36, 16]], levels=new_levels,
                       policy="chunked"))
    assert s.levels == [tuple(x) for x in new_levels] and s.policy == "chunked"
    assert s.config is not None and s.config.manual_divisions == [(112, 20, 1), (96, 36, 16)]
    assert s.config_changes[-1].client == "c2"


def test_dropped_errors_hw_and_unknown_types(ev):
    s = DashboardState()
    s.ingest({"type": "dropped", "v": 1, "count": 3})
    s.ingest({"type": "dropped", "v": 1, "count": 2})
    s.ingest({"type": "error", "v": 1, "field": "path", "reason": "disk full"})
    s.ingest({"type": "hw", "v": 1, "time": 5.0, "cpu_percent": [10.0, 20.0], "host_mem_used_bytes": 1 << 30,
              "host_mem_total_bytes": 1 << 32, "host_mem_percent": 25.0, "dram_bw_util_pct": "n/a"})
    version = s.version
    assert s.ingest({"type": "from-the-future", "v": 2}) is None
    assert s.dropped == 5 and s.errors[-1] == ErrorNotice("path", "disk full")
    assert s.hw is not None and s.hw.cpu_percent == [10.0, 20.0] and s.hw.dram_bw_util_pct == "n/a"
    assert s.hw.sm_util_pct is None  # absent: the server has no NVML figure for it
    assert s.version == version and s.events == 5 and s.skipped == 1 and s.invalid == 0


def test_invalid_events_are_refused_whole_and_counted(ev):
    """A field missing or of the wrong type never reads as 0: the event changes nothing."""
    s = DashboardState()
    s.ingest(ev.hello)
    s.ingest(ev.round(0, 0.01, level=4))
    version = s.version
    renamed = ev.round(1, 0.02, level=5)
    renamed["decode_units_v2"] = renamed.pop("decode_units")
    nan = ev.round(1, 0.02, level=5) | {"decode_step_s": float("nan")}
    text = ev.round(1, 0.02, level=5) | {"waiting": "3"}
    newer = ev.round(1, 0.02, level=5) | {"v": 2}
    for bad in (renamed, nan, text, newer):
        assert s.ingest(bad) is None
    assert s.invalid == 4 and s.version == version and s.rounds_seen == 1 and s.level == 4
    assert s.invalid_reason == "round: protocol version 2; this pdtop reads version 1"


def test_clock_going_back_or_a_seek_resets_the_series(ev):
    s = DashboardState()
    s.ingest(ev.hello)
    for i in range(10):
        s.ingest(ev.round(i, 5.0 + i * 0.01))
    s.ingest(ev.request("first_token", 1, 5.0, output_tokens=1, ttft_s=0.2))
    s.ingest(ev.round(0, 0.01))  # a new engine (its clock restarted)
    assert len(s.rounds) == 1 and not s.ttfts
    config = {**ev.hello["engine"]["config"], "decode_bs_divisor": 12, "levels": ev.levels[:3]}
    s.ingest({"type": "seek", "v": 1, "position": 3.0, "config": config})
    assert not s.rounds and s.config is not None and s.config.decode_bs_divisor == 12 and len(s.levels) == 3


def test_buffers_are_bounded(ev):
    s = DashboardState(max_rounds=100, max_requests=10)
    for i in range(1000):
        s.ingest(ev.round(i, i * 0.001))
        s.ingest(ev.request("first_token", i, output_tokens=1, ttft_s=0.1))
    assert len(s.rounds) == 100 and len(s.ttfts) == 10 and s.rounds_seen == 1000


def test_level_rows_after_the_levels_change_count_only_rounds_on_the_levels_in_force(ev):
    """Issue 25 item 3: after live tuning tried a 3-level table and rolled back, rows 1 and 2 showed
    the candidate's figures (its 112/20 and 104/28 rounds) for 30 s, carried over by index."""
    s = DashboardState()
    s.ingest(ev.hello)
    candidate = [[132, 0], [112, 20], [0, 132]]
    s.ingest(ev.config(0.0, 0, levels=candidate))
    t = 0.0
    for i in range(20):  # the candidate ran its level 1 (112/20)
        t += 0.0155
        r = ev.round(i, t, step=0.0155, level=1)
        r.update(prefill_units=112, decode_units=20)
        s.ingest(r)
    s.ingest(ev.config(t, 20, levels=ev.levels))  # rolled back to the 8 levels
    for i in range(20, 25):
        t += 0.01
        s.ingest(ev.round(i, t, step=0.01, level=4))
    rows = {level: stat for level, _, _, stat in level_rows(s.levels, s.window(), s.levels_since)}
    assert [level for level, stat in rows.items() if stat is not None] == [4], rows
    assert rows[4].share == pytest.approx(1.0)
    # keyed by split: a row shows the rounds that ran on its split, whatever the index was then
    by_split = {(st.prefill_units, st.decode_units): st for st in level_stats(s.window())}
    assert (112, 20) in by_split and tuple(ev.levels[4]) in by_split
