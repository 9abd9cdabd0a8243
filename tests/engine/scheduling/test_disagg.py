"""The disagg policy: two instances, each with its own KV pool, the KV over a link between them."""
from __future__ import annotations

import os
import threading

import pytest

from pdtop.analysis.estimate import estimate
from pdtop.bench.policy_bench import SCENARIOS, run_policy
from pdtop.engine.build import build_engine
from pdtop.engine.errors import ControlError, DeviceError
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.records import KvTransfer, RoundRecord
from pdtop.engine.roofline.gpu_specs import parse_gpu
from pdtop.engine.roofline.kv import parse_link
from pdtop.engine.scheduling.commands import PinLevel, Set
from pdtop.engine.scheduling.tokens import generate


@pytest.mark.parametrize("link", ["rdma100", "nvlink"])
def test_sim_itl_and_ttft_match_the_estimates_disagg_row(link):
    """The seed's scenario: decode ITL is decode-only, TTFT a whole-GPU prefill plus the KV over the link."""
    row = next(r for r in estimate(parse_gpu("H100"), synthetic_config("qwen3-8b"), link=parse_link(link))
               if r.kind == "disagg")
    res = run_policy(build_engine("sim:H100", policy="disagg", link=parse_link(link)), SCENARIOS["sim"]).summary
    assert res["itl_ms"]["p50"] == pytest.approx(row.itl_ms, rel=0.05)
    assert res["ttft_ms"]["p50"] == pytest.approx(row.prefill_ms, rel=0.02)
    assert res["interference"]["p99"] == pytest.approx(1.0, abs=0.01)


def test_no_transfer_starts_before_decode_reserved_its_slots():
    """SGLang's handshake: a request whose decode slots do not fit is never prefilled, though the
    prefill instance's pool has room; once decode frees its slots, reserve -> prefill -> transfer."""
    engine = build_engine("sim:H100", policy="disagg", kv_capacity_tokens=4096)
    seen: list = []
    engine.add_sink(seen.append)
    first = engine.submit(engine.prompts.make(2000), 1000, ignore_eos=True)  # 3008 of 4096 decode slots
    second = engine.submit(engine.prompts.make(2000), 16, ignore_eos=True)  # does not fit beside it
    pair = None
    for _ in range(200):
        engine.step()
        pair = engine.scheduler.active
        if first.output_ids:
            break
    assert pair.name == "disagg" and first.output_ids
    for _ in range(50):  # first decodes; second waits for decode slots, and so never reaches prefill
        rec = engine.step()
        assert second.status.value == "waiting" and not second.table.blocks
        assert rec.disagg is not None and rec.disagg.reserving == 1 and rec.disagg.prefilling == 0
    assert pair.prefill.pool.used_tokens == 0  # the prefill pool had room all along
    engine.run_until_idle()
    transfers = {t.request_id: t for t in seen if isinstance(t, KvTransfer)}
    t = transfers[second.id]
    assert t.reserved >= first.token_times[-1]  # reserved once first finished and freed its slots
    assert t.reserved <= t.start < t.end <= second.token_times[0]
    assert t.bytes == 2000 * engine.executor.cfg.kv_bytes_per_token(2) and t.link == "rdma400"
    rounds = [r for r in seen if isinstance(r, RoundRecord)]
    assert {r.instance for r in rounds} == {"decode", "prefill"} and all(r.disagg.devices == 2 for r in rounds)
    prefill = [r for r in rounds if r.instance == "prefill"]  # one a batch: first's, then second's
    assert [r.index for r in prefill] == [0, 1] and all(r.decode_bs == 0 and r.running == 0 for r in prefill)
    began = prefill[1].time - prefill[1].round_s
    assert t.reserved <= began < prefill[1].time <= t.start  # reserved, then prefilled, then sent
    assert prefill[1].kv_used_tokens == 2000 and prefill[1].flops > 0  # the prefill pool, the prefill's work


def test_cpu_kv_really_moves_and_text_equals_generate(model_fp32, tokenizer):
    """On the CPU the prompt's K/V is copied from the prefill pool to the decode pool: greedy text equals
    `generate`'s (pdtop generate's path), which it could not with the decode pool's slots left unwritten."""
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner

    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user",
                                                              "content": "What is the capital of France?"}]))
    alone = Request(0, list(prompt), SamplingParams(max_tokens=12))
    want = list(generate(ModelRunner(model_fp32, 1024), alone))
    link = parse_link("0.2")  # 200 MB/s: paced
    engine = build_engine("cpu", loaded_model=model_fp32, policy="disagg", kv_capacity_tokens=1024, link=link)
    try:
        seen: list = []
        engine.add_sink(seen.append)
        other = engine.submit(tokenizer.encode("The history of"), 20, ignore_eos=True)
        req = engine.submit(list(prompt), 12)
        engine.run_until_idle()
        pair = engine.scheduler.active
        assert pair.name == "disagg"
        a, b = pair.prefill.kv.data, engine.executor.kv.data  # type: ignore[attr-defined]
        assert a.data_ptr() != b.data_ptr()  # two pools
        assert req.output_ids == want and tokenizer.decode(want).startswith("The capital of France is Paris")
        assert len(other.output_ids) == 20
        transfers = [t for t in seen if isinstance(t, KvTransfer)]
        assert sorted(t.request_id for t in transfers) == sorted([other.id, req.id])
        t = next(t for t in transfers if t.request_id == req.id)
        assert t.bytes == len(prompt) * model_fp32.config.kv_bytes_per_token(4) and t.link == "0.2 GB/s"
        assert t.end - t.start >= t.bytes / link.bandwidth  # paced to the link
        assert pair.prefill.pool.used_tokens == 0 and engine.executor.pool.used_tokens == 0
        copier = next(t for t in threading.enumerate() if t.name.startswith("pdtop-kv-link"))
        assert copier.native_id is not None  # the copy runs on the sending side's cores, not decode's
        assert os.sched_getaffinity(copier.native_id) == set(engine.device.side_cores(0))  # type: ignore[attr-defined]
    finally:
        engine.close()


def test_one_gpu_refuses_disagg_naming_sim():
    with pytest.raises(DeviceError, match="--device sim:"):
        build_engine("cuda", policy="disagg")


def test_live_switch_to_and_from_disagg():
    engine = build_engine("sim:H100", policy="pdmux")
    reqs = [engine.submit(engine.prompts.make(1000), 200, ignore_eos=True) for _ in range(4)]
    for _ in range(5):
        engine.step()
    engine.control(Set(policy="disagg"))
    late = engine.submit(engine.prompts.make(3000), 8, ignore_eos=True)
    policies = set()
    for _ in range(60):
        policies.add(engine.step().policy)
    assert "disagg" in policies and "disagg" in engine.scheduler.made and late.output_ids
    pinned = engine.control(PinLevel(1))
    engine.step()
    with pytest.raises(ControlError, match="switch to pdmux to pin a level"):  # nothing to pin: changes nothing
        pinned.result(0)
    assert engine.config_record().pinned_level is None
    engine.control(Set(policy="chunked"))
    engine.run_until_idle()
    assert engine.scheduler.policy == "chunked" and engine.device.instances == 1
    assert all(len(r.output_ids) == 200 for r in reqs) and len(late.output_ids) == 8


def test_a_device_that_cannot_hold_two_instances_refuses_disagg():
    """One core (a CPU device the splits would refuse anyway) or a GPU: ControlError, naming why."""
    from pdtop.engine.devices.cpu import CpuDevice
    from pdtop.engine.scheduling.disagg import check_disagg

    dev = CpuDevice([(1, 0), (0, 1)], cores=[0])
    try:
        with pytest.raises(ControlError, match="two cores"):
            check_disagg(dev)
    finally:
        dev.close()


def test_aborts_inside_the_pair_end_once_their_kv_lands_and_free_both_pools():
    """A request aborted while reserved, prefilling or on the link ends when it would join decode (its
    first token then, as under pdmux), and neither pool keeps a block of it."""
    engine = build_engine("sim:H100", policy="disagg", link=parse_link("1"))  # 1 GB/s: transfers take a while
    decoding = engine.submit(engine.prompts.make(100), 300, ignore_eos=True)
    for _ in range(5):
        engine.step()
    a, b, c = (engine.submit(engine.prompts.make(4000), 10, ignore_eos=True) for _ in range(3))
    engine.step()
    pair = engine.scheduler.active
    assert pair.name == "disagg" and pair.batch is not None and [i.req for i in pair.queue] == [c]
    engine.abort(c)  # reserved, waiting for the prefill instance
    engine.abort(a)  # prefilling
    engine.run_until_idle()
    assert (a.finish_reason, len(a.output_ids)) == ("abort", 1) and (c.finish_reason, len(c.output_ids)) == ("abort", 1)
    assert (b.finish_reason, len(b.output_ids)) == ("length", 10) and len(decoding.output_ids) == 300
    for pool in (engine.executor.pool, pair.prefill.pool):
        assert pool.used_tokens == 0 and pool.committed_blocks == 0
