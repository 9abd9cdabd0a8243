"""Under disagg, rounds carry their instance and the prefill instance's state; KV transfers are events.
Both round-trip through the encoders (the stream's and the recordings') and decode_event; rounds of a
recording made before the fields existed still decode; /metrics counts them under SGLang's names."""
from __future__ import annotations

import json

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.records import KvTransfer, RoundRecord
from pdtop.engine.roofline.kv import parse_link
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.encode import encode, encode_record


def _disagg_records() -> list:
    engine = build_engine("sim:H100", policy="disagg", link=parse_link("rdma100"))
    seen: list = []
    engine.add_sink(seen.append)
    engine.submit(engine.prompts.make(100), 400, ignore_eos=True)  # decoding while the long prompt prefills
    for _ in range(5):
        engine.step()
    engine.submit(engine.prompts.make(4096), 4, ignore_eos=True)
    engine.run_until_idle()
    return seen


def test_disagg_rounds_and_transfers_round_trip():
    seen = _disagg_records()
    transfer = next(r for r in seen if isinstance(r, KvTransfer))
    rounds = [r for r in seen if isinstance(r, RoundRecord)]
    for rec in [transfer, *rounds]:
        for text in (encode_record(rec), encode(rec)):  # orjson's path and json's
            assert decode_event(json.loads(text)) == rec
    assert transfer.link == "rdma100" and transfer.bytes > 0 and transfer.reserved <= transfer.start < transfer.end
    busy = [r for r in rounds if r.disagg is not None and r.disagg.prefilling]
    assert busy and all(r.instance == "decode" and r.disagg.prefill_kv_used_tokens == 4096 for r in busy)
    assert [(r.index, r.kv_used_tokens) for r in rounds if r.instance == "prefill"] == [(0, 100), (1, 4096)]
    assert any(r.disagg is not None and r.disagg.transfers == 1 and r.disagg.transfer_bytes == transfer.bytes
               for r in rounds)


def test_a_round_recorded_before_instance_existed_still_decodes():
    rec = next(r for r in _disagg_records() if isinstance(r, RoundRecord))
    old = json.loads(encode_record(rec))
    del old["instance"], old["disagg"]
    old["policy"] = "pdmux"
    decoded = decode_event(old)
    assert isinstance(decoded, RoundRecord) and decoded.instance is None and decoded.disagg is None


def test_metrics_carry_sglangs_disagg_queues_and_the_transfers():
    """`/metrics` under disagg: SGLang's queue names, the transfers' latency and bytes."""
    from prometheus_client.parser import text_string_to_metric_families

    from pdtop.api.metrics import EngineMetrics

    engine = build_engine("sim:H100", policy="disagg", link=parse_link("rdma100"))
    metrics = EngineMetrics(engine)
    engine.add_sink(metrics.sink)
    engine.submit(engine.prompts.make(100), 400, ignore_eos=True)
    for _ in range(5):
        engine.step()
    engine.submit(engine.prompts.make(4096), 4, ignore_eos=True)
    seen_inflight = 0.0
    while not engine.idle():
        engine.step()
        samples = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
                   for s in f.samples}
        seen_inflight = max(seen_inflight, samples["pdtop:num_prefill_inflight_queue_reqs"])
    assert seen_inflight == 1  # the long prompt's KV on the link
    per_token = engine.executor.cfg.kv_bytes_per_token(2)
    assert samples["pdtop:kv_transfer_bytes_total"] == (100 + 4096) * per_token
    assert samples["pdtop:kv_transfer_latency_seconds_count"] == 2
    assert samples["pdtop:kv_transfer_latency_seconds_sum"] == pytest.approx((100 + 4096) * per_token / 12.5e9)
    assert samples["pdtop:num_decode_transfer_queue_reqs"] == samples["pdtop:num_decode_prealloc_queue_reqs"] == 0
