"""The scheduler on the simulated GPU: deterministic, follows SGLang's level rule, matches the seed."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from pdtop.analysis.estimate import estimate
from pdtop.bench.policy_bench import SCENARIOS, run_policy
from pdtop.engine.build import build_engine, parse_device
from pdtop.engine.errors import ConfigError, ControlError, EngineError
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.records import ConfigChange, RequestRecord, RoundRecord
from pdtop.engine.request import RequestStatus
from pdtop.engine.roofline.gpu_specs import parse_gpu
from pdtop.engine.scheduling.commands import AutoLevel, PinLevel, Set
from pdtop.engine.scheduling.splits import choose, prefill_layers_per_step, stream_groups
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry.server.commands import parse_command


def _records(seed: int, rounds: int = 400) -> list:
    engine = build_engine("sim:H100", workload=WorkloadSpec(rate=20, prompt_tokens=(64, 4096), seed=seed), seed=seed)
    out: list = []
    engine.add_sink(out.append)
    for _ in range(rounds):
        engine.step()
    return out


def test_simulated_engine_is_deterministic_for_a_seed():
    a, b, c = _records(1), _records(1), _records(2)
    assert a == b
    assert a != c
    assert sum(isinstance(r, RoundRecord) for r in a) == 400


def test_level_follows_decode_batch_by_sglangs_rule():
    engine = build_engine("sim:H100")
    groups = stream_groups(132, 9)
    for _ in range(20):
        engine.submit(engine.prompts.make(512), 500, ignore_eos=True)
    engine.run_until_idle(max_rounds=30)
    assert len(engine.scheduler.running) == 20
    rec = engine.step()
    assert (rec.prefill_units, rec.decode_units) == groups[-1]  # decode only: whole device to decode
    engine.submit(engine.prompts.make(8192), 4, ignore_eos=True)
    rec = engine.step()
    level = choose(groups, 20, has_prefill=True)
    assert rec.level == level and (rec.prefill_units, rec.decode_units) == groups[level]
    assert rec.prefills[0].layers_per_round == prefill_layers_per_step(8192, 36) == 8
    layers = [engine.step().prefills for _ in range(3)]
    assert [p[0].layers_done for p in layers if p] == sorted(p[0].layers_done for p in layers if p)


def test_greedy_outputs_do_not_depend_on_policy_on_sim():
    """Token counts and finish order per request are the same under all policies."""
    lengths = {}
    for policy in ("pdmux", "chunked", "prefill-first", "disagg"):
        engine = build_engine("sim:H100", policy=policy)
        reqs = [engine.submit(engine.prompts.make(n), m, ignore_eos=True) for n, m in [(100, 5), (3000, 7), (9000, 3)]]
        engine.run_until_idle()
        lengths[policy] = [len(r.output_ids) for r in reqs]
    assert lengths["pdmux"] == lengths["chunked"] == lengths["prefill-first"] == lengths["disagg"] == [5, 7, 3]


def test_pdmux_keeps_itl_near_decode_only_while_prefill_first_stalls():
    out = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--policy", "all", "--device", "sim:H100", "--json"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["scenario"]["long_tokens"] == 8192 and doc["device"] == "sim:H100"
    res = doc["results"]
    assert set(res) == {"pdmux", "chunked", "prefill-first", "disagg"}
    assert {p: r["devices"] for p, r in res.items()} == {"pdmux": 1, "chunked": 1, "prefill-first": 1, "disagg": 2}
    dg = res["disagg"]  # its own GPU for decode: no interference; the second GPU is charged per device
    assert dg["interference"]["p99"] == pytest.approx(1.0, abs=0.01)
    assert dg["output_tok_s_per_device"] == pytest.approx(dg["output_tok_s"] / 2)
    assert dg["goodput_tok_s_per_device"] == pytest.approx(dg["goodput_tok_s"] / 2)
    pd, pf = res["pdmux"], res["prefill-first"]
    assert pd["interference"]["p99"] <= 2
    # pdmux decodes on part of the SMs, slower than on all of them; prefill-first always on all of them
    assert pd["fewer_cores"]["p50"] > 1.05 and pf["fewer_cores"]["max"] == pytest.approx(1.0)
    # prefill-first: the worst gap covers a whole 8192-token prefill
    assert pf["itl_ms"]["max"] >= pf["ttft_ms"]["p50"] * 0.95
    assert pd["itl_ms"]["p99"] < res["chunked"]["itl_ms"]["p99"] < pf["itl_ms"]["max"]


def test_simulated_run_is_consistent_with_the_estimate():
    """The seed's scenario on sim:H100 lands within 10% of `pdtop estimate` (S_SAT 66)."""
    rows = {r.kind: r for r in estimate(parse_gpu("H100"), synthetic_config("qwen3-8b"), s_sats=(66,))}
    res = {p: run_policy(build_engine("sim:H100", policy=p), SCENARIOS["sim"]).summary
           for p in ("pdmux", "prefill-first")}
    pd_row, pf_row = rows["pdmux"], rows["prefill-first"]
    assert res["pdmux"]["itl_ms"]["p50"] == pytest.approx(pd_row.itl_ms, rel=0.1)
    assert res["pdmux"]["ttft_ms"]["p50"] == pytest.approx(pd_row.prefill_ms, rel=0.1)
    assert res["prefill-first"]["ttft_ms"]["p50"] == pytest.approx(pf_row.prefill_ms, rel=0.1)


def test_control_applies_at_round_boundary_and_is_announced():
    engine = build_engine("sim:H100")
    seen: list = []
    engine.add_sink(seen.append)
    applied = engine.control(Set(decode_bs_divisor=24, chunk_size=256), client="t")
    assert engine.config.decode_bs_divisor == 36 and not applied.done()  # not before the boundary
    engine.step()
    assert engine.config_record().decode_bs_divisor == 24 and engine.config.chunk_size == 256
    change = next(r for r in seen if isinstance(r, ConfigChange))
    assert change.changes["decode_bs_divisor"] == {"old": 36, "new": 24} and change.client == "t"
    assert applied.result(0).changes == change.changes == {"decode_bs_divisor": {"old": 36, "new": 24},
                                                           "chunk_size": {"old": 512, "new": 256}}
    pinned = engine.control(PinLevel(3))
    rec = engine.step()
    assert rec.pinned and rec.level == 3 and pinned.result(0).changes == {"pinned_level": {"old": None, "new": 3}}
    again = engine.control(PinLevel(3))
    assert engine.step().pinned and again.result(0).changes == {}  # pinned already: nothing changed
    engine.control(AutoLevel())
    assert not engine.step().pinned
    engine.control(Set(manual_divisions=[[112, 20, 0], [96, 36, 16]]))
    engine.step()
    assert engine.describe().levels == [(132, 0), (112, 20), (96, 36), (0, 132)]


@pytest.mark.parametrize("msg, field", [
    ({"cmd": "explode"}, "cmd"),
    ({"cmd": "pin_level", "level": 99}, "level"),
    ({"cmd": "pin_level", "level": True}, "level"),
    ({"cmd": "pin_level"}, "level"),
    ({"cmd": "set"}, "set"),
    ({"cmd": "set", "decode_bs_divisor": 0}, "decode_bs_divisor"),
    ({"cmd": "set", "decode_bs_divisor": "8"}, "decode_bs_divisor"),
    ({"cmd": "set", "decode_bs_divisor": 10**30}, "decode_bs_divisor"),
    ({"cmd": "set", "split_forward_token_budget": -1}, "split_forward_token_budget"),
    ({"cmd": "set", "manual_divisions": [[200, 20, 0]]}, "manual_divisions"),
    ({"cmd": "set", "manual_divisions": "x"}, "manual_divisions"),
    ({"cmd": "set", "policy": "fastest"}, "policy"),
    ({"cmd": "set", "workload_rate": float("nan")}, "workload_rate"),
    ({"cmd": "set", "colour": "red"}, "colour"),
    ({"cmd": "inject", "prompt_tokens": 10**9}, "prompt_tokens"),
    ({"cmd": "auto_level", "level": 2}, "level"),
])
def test_bad_control_is_rejected_and_changes_nothing(msg, field):
    engine = build_engine("sim:H100", workload=WorkloadSpec(rate=5))
    before = engine.config_record()
    err = _refusal(engine, msg)
    assert err.field == field and err.reason
    engine.step()
    assert engine.config_record() == before


def _refusal(engine, msg: dict) -> ControlError:
    """`msg` refused: when the command is made of the wire object (its form), or by the engine at the
    next round boundary (what depends on its state: the levels, the context)."""
    try:
        future = engine.control(parse_command(msg))
    except ControlError as exc:
        return exc
    engine.step()
    refused = future.exception(0)
    assert isinstance(refused, ControlError)
    return refused


def test_policy_switch_waits_for_in_flight_prefill():
    engine = build_engine("sim:H100", policy="pdmux")
    engine.submit(engine.prompts.make(100), 30, ignore_eos=True)  # decoding: the prefill is sliced
    engine.step()
    engine.submit(engine.prompts.make(8192), 3, ignore_eos=True)
    engine.step()
    assert engine.scheduler.active.batch is not None
    switched = engine.control(Set(policy="chunked"))
    pinned = engine.control(PinLevel(2))  # asked after it: applied after it
    late = engine.submit(engine.prompts.make(100), 3, ignore_eos=True)
    engine.step()
    assert engine.scheduler.policy == "pdmux"  # the prefill still owns the prefill side
    assert not switched.done() and late.status is RequestStatus.WAITING  # pdmux takes no new request meanwhile
    assert not pinned.done() and engine.scheduler.pinned is None
    engine.run_until_idle()
    engine.step()
    assert engine.scheduler.policy == "chunked" and late.finish_reason == "length"
    assert switched.result(0).changes == {"policy": {"old": "pdmux", "new": "chunked"}}
    assert pinned.result(0).changes == {"pinned_level": {"old": None, "new": 2}}


def test_kv_admission_waits_for_room_and_rejects_what_can_never_fit():
    """The simulator counts KV with the runner's block pool: a request is admitted once its
    prompt + max_tokens fits beside the others' promises; more than the whole cache is rejected."""
    engine = build_engine("sim:H100", kv_capacity_tokens=4096)
    pool = engine.executor.pool
    reqs = [engine.submit(engine.prompts.make(1000), 500, ignore_eos=True) for _ in range(4)]  # 94 of 256 blocks each
    huge = engine.submit(engine.prompts.make(5000), 4, ignore_eos=True)
    seen: list = []
    engine.add_sink(seen.append)
    rounds = []
    while not engine.scheduler.idle():
        rounds.append(engine.step())
        assert pool.committed_blocks <= pool.num_blocks
        live = [r for r in reqs if r.status is not RequestStatus.WAITING and not r.finished]
        assert pool.used_tokens == sum(r.num_cached for r in live if r.num_cached) + \
            sum(r.prompt_len for r in live if not r.num_cached)
    assert max(r.running for r in rounds) == 2 and rounds[0].waiting == 3  # two at a time; FIFO: huge waits too
    assert all(len(r.output_ids) == 500 for r in reqs) and pool.used_tokens == pool.committed_blocks == 0
    assert huge.finish_reason == "rejected" and "KV cache too small" in huge.error
    assert any(isinstance(r, RequestRecord) and r.request_id == huge.id and r.finish_reason == "rejected" for r in seen)


def test_pin_dropped_by_new_levels_is_announced():
    engine = build_engine("sim:H100")
    seen: list = []
    engine.add_sink(seen.append)
    engine.control(PinLevel(6))
    engine.step()
    engine.control(Set(manual_divisions=[[112, 20, 0]]))
    rec = engine.step()
    change = [r for r in seen if isinstance(r, ConfigChange)][-1]
    assert not rec.pinned and engine.config_record().pinned_level is None
    assert change.changes["pinned_level"] == {"old": 6, "new": None} and "levels" in change.changes


@pytest.mark.parametrize("text, kind, index, gpu", [
    ("cpu", "cpu", 0, None), ("cuda", "cuda", 0, None), ("cuda:3", "cuda", 3, None), ("sim:h20", "sim", 0, "H20"),
    ("sim:custom:sms=16,cc=8.0,bw=1e12,flops=1e14,name=tiny", "sim", 0, "tiny"),
])
def test_parse_device(text, kind, index, gpu):
    d = parse_device(text)
    assert (d.kind, d.index, d.gpu.name if d.gpu else None) == (kind, index, gpu)


@pytest.mark.parametrize("text, words", [("tpu", "unknown device 'tpu'"), ("cuda:x", "GPU index"),
                                         ("sim:B300", "unknown GPU 'B300'"), ("sim:", "unknown GPU")])
def test_bad_device_strings_are_one_engine_error(text, words):
    with pytest.raises(EngineError, match=words):
        build_engine(text)


def test_bad_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="policy"):
        build_engine("sim:H100", policy="fastest")


def test_pin_past_the_levels_queued_before_it_is_refused():
    engine = build_engine("sim:H100")
    engine.control(Set(manual_divisions=[[112, 20, 0]]))  # 3 levels from the next boundary
    pinned = engine.control(PinLevel(6))  # valid against today's 8 levels, not the next
    rec = engine.step()
    with pytest.raises(ControlError, match=r"level: must be in 0\.\.2, got 6"):
        pinned.result(0)
    assert not rec.pinned and engine.describe().levels == [(132, 0), (112, 20), (0, 132)]


def test_a_warmup_prompt_runs_before_the_measured_ones_and_is_reported_apart():
    """`Scenario.warmup_prompts` (the cuda scenario's 1): a long prompt before the measured ones, its ITLs
    reported on their own, the measured figures over `long_prompts` prompts as without it."""
    sc = dataclasses.replace(SCENARIOS["sim"], long_prompts=2)
    plain = run_policy(build_engine("sim:H100"), sc).summary
    warm = run_policy(build_engine("sim:H100"), dataclasses.replace(sc, warmup_prompts=1)).summary
    assert "warmup_itl_ms" not in plain and warm["warmup_itl_ms"]["prompts"] == 1
    assert warm["ttft_ms"]["n"] == plain["ttft_ms"]["n"] == 2
    assert warm["warmup_itl_ms"]["max"] == pytest.approx(warm["itl_ms"]["max"], rel=0.1)  # the sim has no JIT
    assert SCENARIOS["cuda"].warmup_prompts == 1 and SCENARIOS["sim"].warmup_prompts == 0


def test_a_policy_run_freezes_the_heap_and_gives_it_back():
    """The rounds of a benchmark run under a frozen heap, as `pdtop serve`'s (no full collection over the
    model's objects lands in a round); what was frozen is collectable again after."""
    import gc

    engine = build_engine("sim:H100")
    seen: list[int] = []
    real = engine.step

    def step():
        seen.append(gc.get_freeze_count())
        return real()

    engine.step = step  # type: ignore[method-assign]
    gc.unfreeze()  # what an in-process server's run froze earlier in this pytest process
    run_policy(engine, dataclasses.replace(SCENARIOS["sim"], long_prompts=1))
    assert min(seen) > 0 and gc.get_freeze_count() == 0
