"""Events -> their JSON: the envelope, the fields, non-finite numbers."""
from __future__ import annotations

import dataclasses
import json

from pdtop.engine.description import EngineConfig
from pdtop.engine.records import ConfigChange, PrefillProgress, RequestRecord, RoundRecord
from pdtop.telemetry import encode as ev
from pdtop.telemetry.events import ConfigEvent, Dropped


def test_engine_records_encode_as_asdict_plus_type():
    """The fast encoder gives exactly `dataclasses.asdict` with type and v, one JSON text."""
    rnd = RoundRecord(index=3, time=1.5, policy="pdmux", level=2, prefill_units=104, decode_units=28, pinned=False,
                      decode_bs=5, decode_step_s=0.004, round_s=0.005,
                      prefills=[PrefillProgress([1, 2], 900, 12, 36, 4)], tokens_emitted=5, waiting=1, running=5,
                      kv_used_tokens=4000, kv_capacity_tokens=2**20, bytes_moved=1.6e10, flops=2e11)
    req = RequestRecord("finish", 2, 3.0, 900, 64, ttft_s=0.2, itls_s=[0.01, 0.02], finish_reason="length")
    for rec, kind in ((rnd, "round"), (req, "request")):
        want = {"type": kind, "v": 1, **dataclasses.asdict(rec)}
        assert json.loads(ev.encode_record(rec)) == want
        assert ev.wire(rec) == want
    rnd.decode_step_s = float("nan")  # not JSON: becomes null rather than breaking the stream
    assert json.loads(ev.encode_record(rnd))["decode_step_s"] is None


def test_config_events_carry_the_whole_config_and_helpers_have_the_envelope():
    change = ConfigChange(2.0, 10, {"decode_bs_divisor": {"old": 36, "new": 24}}, client="c1")
    config = EngineConfig(sm_group_num=3, manual_divisions=[(72, 60, 1)], split_forward_token_budget=65536,
                          decode_bs_divisor=24, chunk_size=512, policy="pdmux", pinned_level=None,
                          levels=[(132, 0), (72, 60), (0, 132)], workload_rate=2.0, workload_paused=False)
    event = ev.wire(ConfigEvent.after(change, config))
    assert event == {"type": "config", "v": 1, "time": 2.0, "round_index": 10,
                     "changes": {"decode_bs_divisor": {"old": 36, "new": 24}}, "client": "c1",
                     "config": {"sm_group_num": 3, "manual_divisions": [[72, 60, 1]],
                                "split_forward_token_budget": 65536, "decode_bs_divisor": 24, "chunk_size": 512,
                                "policy": "pdmux", "pinned_level": None, "levels": [[132, 0], [72, 60], [0, 132]],
                                "workload_rate": 2.0, "workload_paused": False, "level_rule": None,
                                "slo_itl_ms": None}}  # pairs as lists
    assert ev.reply_event(4, False, "level", "too big") == {
        "type": "reply", "v": 1, "id": 4, "ok": False, "error": {"field": "level", "reason": "too big"}}
    assert ev.wire(Dropped(3)) == {"type": "dropped", "v": 1, "count": 3}
    assert json.loads(ev.encode({"x": float("inf"), "y": [float("nan")]})) == {"x": None, "y": [None]}
