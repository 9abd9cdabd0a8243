"""Under disagg, rounds carry their instance and the prefill instance's state; KV transfers are events.
Both round-trip through the encoders (the stream's and the recordings') and decode_event; rounds of a
recording made before the fields existed still decode."""
from __future__ import annotations

import json

from pdtop.engine.build import build_engine
from pdtop.engine.records import KvTransfer, RoundRecord
from pdtop.engine.roofline.kv import parse_link
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.encode import encode, encode_record, record_event


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
        for text in (encode_record(rec), encode(record_event(rec))):  # orjson's path and json's
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
