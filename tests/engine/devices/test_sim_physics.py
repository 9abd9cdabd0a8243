"""The simulated GPU keeps to physics: shared memory bandwidth, and each side's bytes in the rounds it runs."""
from __future__ import annotations

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.devices.base import Work
from pdtop.engine.devices.sim import SimDevice
from pdtop.engine.records import RoundRecord
from pdtop.engine.roofline.cost import achieved_bandwidth, prefill_bytes
from pdtop.engine.roofline.gpu_specs import SPECS
from pdtop.engine.roofline.sharing import share_bandwidth
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.workload import WorkloadSpec

H100 = SPECS["H100"]


def test_bandwidth_is_shared_max_min_fairly():
    assert share_bandwidth(10.0, [2.0, 3.0]) == [2.0, 3.0]  # enough for both
    assert share_bandwidth(10.0, [8.0, 8.0]) == [5.0, 5.0]
    assert share_bandwidth(10.0, [2.0, 20.0]) == [2.0, 8.0]  # the small ask is met, the big one gets the rest
    assert share_bandwidth(10.0, []) == []


def test_two_memory_bound_sides_each_get_half_the_bandwidth():
    dev = SimDevice(H100, [(132, 0), (66, 66), (0, 132)])
    dev.set_level(1)  # 66 SMs each: both saturate bandwidth (S_SAT 66) when alone
    bw = achieved_bandwidth(H100)
    prefill = Work("prefill", 0.0, 100 * bw, lambda: None)  # 100 s of streaming alone
    decode = Work("decode", 0.0, bw, lambda: None)  # 1 s alone
    dev.submit_prefill(prefill)
    dev.run_decode(decode)
    assert dev.now() == pytest.approx(2.0)  # half the bandwidth each
    assert dev.prefill_progress() == pytest.approx(1 / 100)
    dev.wait_prefill()  # alone again: the 99 s of bytes left at full bandwidth
    assert dev.now() == pytest.approx(2.0 + 99.0)
    assert dev.prefill_progress() == 1.0


def test_no_round_moves_more_bytes_than_peak_bandwidth():
    """A long busy run (the case the issue measured: 905 of 6000 rounds over peak, up to 5.15 TB/s)."""
    engine = build_engine("sim:H100", config=PdmuxConfig(decode_bs_divisor=8), workload=WorkloadSpec(rate=30, seed=0))
    rounds: list[RoundRecord] = []
    engine.add_sink(lambda r: rounds.append(r) if isinstance(r, RoundRecord) else None)
    for _ in range(6000):
        engine.step()
    both = [r for r in rounds if r.decode_bs and r.prefills]
    assert len(both) > 400  # prefill and decode really did run side by side
    assert all(r.bytes_moved == 0 for r in rounds if r.round_s == 0)
    worst = max(r.bytes_moved / r.round_s for r in rounds if r.round_s > 0)
    assert worst <= achieved_bandwidth(H100) * (1 + 1e-9) < H100.mem_bw


def _decode_rounds(long_prompt: bool) -> list[RoundRecord]:
    """32 requests decoding; with `long_prompt`, an 8192-token prompt arrives after 5 rounds. The rounds
    until it has its first token."""
    engine = build_engine("sim:H100")
    for _ in range(32):
        engine.submit(engine.prompts.make(2048), 1000, ignore_eos=True)
    while len(engine.scheduler.running) < 32:
        engine.step()
    rounds = [engine.step() for _ in range(5)]
    if long_prompt:
        req = engine.submit(engine.prompts.make(8192), 4, ignore_eos=True)
        while not req.output_ids:
            rounds.append(engine.step())
    else:
        rounds += [engine.step() for _ in range(200)]
    return rounds


def test_a_prefill_chunk_is_charged_to_the_rounds_it_runs_in():
    """Decode steps are the same with or without the prefill beside them, so the difference in bytes per
    round is the prefill's: it adds up to the prompt's bytes, spread over the rounds, none taking it all."""
    with_prefill, alone = _decode_rounds(True), _decode_rounds(False)
    extra = [a.bytes_moved - b.bytes_moved for a, b in zip(with_prefill, alone, strict=False)]
    cfg = build_engine("sim:H100").executor.cfg
    total = prefill_bytes(cfg, 8192, cfg.num_layers, head=True)
    assert sum(extra) == pytest.approx(total, rel=1e-9)
    chunk = prefill_bytes(cfg, 8192, 8)  # 8 layers a round (budget 65536 // 8192)
    assert max(extra) < 0.25 * chunk  # a chunk spans several decode rounds
    assert sum(1 for x in extra if x > 0) > 20
