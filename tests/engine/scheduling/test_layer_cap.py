"""SGLang's `max_split_forward_layers` in the layer split, and `overlap_decode_full_sm` levels run on the
simulated GPU: what the round events show (`layers_per_round`, the units of each side, the times)."""
from __future__ import annotations

from pathlib import Path

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.records import RequestRecord, RoundRecord
from pdtop.engine.roofline import cost
from pdtop.engine.scheduling.commands import Set
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config
from pdtop.engine.scheduling.splits import prefill_layers_per_step, slice_layers

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang_pdmux"  # SGLang's files (test_sglang_yaml.py)

LONG = 8192  # the seed's prompt: 65536 // 8192 = 8 of synthetic:qwen3-8b's 36 layers per slice


def engine_with(config: PdmuxConfig, decoding: int = 8):
    engine = build_engine("sim:H100", config=config)
    for _ in range(decoding):
        engine.submit(engine.prompts.make(256), 2000, ignore_eos=True)
    engine.run_until_idle(max_rounds=decoding + 5)
    assert len(engine.scheduler.running) == decoding
    return engine


def long_prefill_rounds(engine) -> list[RoundRecord]:
    """The rounds from a long prompt's arrival to its first token."""
    req = engine.submit(engine.prompts.make(LONG), 4, ignore_eos=True)
    rounds = []
    while not req.output_ids:
        rounds.append(engine.step())
        assert len(rounds) < 500
    return rounds


def test_slice_layers_rule():
    assert slice_layers(8, 0, True) == 8  # 0: no cap
    assert slice_layers(8, 2, True) == 2
    assert slice_layers(8, 20, True) == 8  # the budget's count is the most
    assert slice_layers(8, 2, False) == 8  # no decode beside it: never capped
    assert slice_layers(1, 2, True) == 1


def test_the_cap_shows_in_layers_per_round_while_decode_runs():
    budget = prefill_layers_per_step(LONG, 36, 65536)
    assert budget == 8
    rounds = long_prefill_rounds(engine_with(PdmuxConfig(max_split_forward_layers=2)))
    shown = [r.prefills[0] for r in rounds if r.prefills]
    assert shown and {p.layers_per_round for p in shown} == {2}
    assert set(range(2, 36, 2)) <= {p.layers_done for p in shown} <= set(range(0, 36, 2))  # slices of 2
    uncapped = [r.prefills[0] for r in long_prefill_rounds(engine_with(PdmuxConfig())) if r.prefills]
    assert {p.layers_per_round for p in uncapped} == {budget}
    assert {8, 16, 24, 32} <= {p.layers_done for p in uncapped} <= {0, 8, 16, 24, 32}


def test_no_cap_when_there_is_no_decode():
    """Nothing decodes: all 36 layers in one slice (newer SGLang), neither 2 (the cap) nor 8 (the budget)."""
    engine = engine_with(PdmuxConfig(max_split_forward_layers=2), decoding=0)
    rounds = long_prefill_rounds(engine)
    whole = cost.prefill_flops(engine.executor.cfg, LONG)
    assert len(rounds) == 1 and rounds[0].flops == pytest.approx(whole)  # its one round ran every layer


def test_the_cap_from_sglangs_file_and_set_live():
    config = load_pdmux_config(str(DATA / "layer_cap.yaml"))  # budget 8192, cap 2
    assert prefill_layers_per_step(LONG, 36, config.token_budget) == 1
    engine = engine_with(config.replace(split_forward_token_budget=65536))
    engine.control(Set(max_split_forward_layers=3))
    engine.step()
    assert engine.config.max_split_forward_layers == 3
    rounds = long_prefill_rounds(engine)
    assert {r.prefills[0].layers_per_round for r in rounds if r.prefills} == {3}


def overlap_run(config: PdmuxConfig) -> tuple[float, list[RoundRecord]]:
    """(the long prompt's TTFT, the rounds while it prefilled beside decode)."""
    engine = engine_with(config, decoding=32)
    records: list = []
    engine.add_sink(records.append)
    rounds = long_prefill_rounds(engine)
    ttft = next(r.ttft_s for r in records if isinstance(r, RequestRecord) and r.kind == "first_token"
                and r.prompt_tokens == LONG)
    return ttft, [r for r in rounds if r.prefills and r.decode_bs]


@pytest.mark.parametrize("name", ["overlap_full_device_decode.yaml", "overlap_layer_cap.yaml"])
def test_overlap_gives_decode_the_whole_device_and_costs_the_prefill(name):
    overlapped = load_pdmux_config(str(DATA / name)).replace(max_split_forward_layers=0)
    exclusive = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 28, 0]])
    ttft_o, both_o = overlap_run(overlapped)
    ttft_x, both_x = overlap_run(exclusive)
    assert {(r.prefill_units, r.decode_units) for r in both_o} == {(104, 132)}
    assert {(r.prefill_units, r.decode_units) for r in both_x} == {(104, 28)}
    step_o = sorted(r.decode_step_s for r in both_o)[len(both_o) // 2]
    step_x = sorted(r.decode_step_s for r in both_x)[len(both_x) // 2]
    assert step_o < 0.6 * step_x  # decode on 132 SMs (66 saturate it) instead of 28
    # decode (high priority) takes 66 - 28 = 38 of the prefill's 104 SMs while it runs
    assert ttft_o > 1.3 * ttft_x


def test_overlap_set_live_rebuilds_the_levels_and_is_refused_without_divisions():
    from pdtop.engine.errors import ControlError

    engine = build_engine("sim:H100", config=PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 28, 1]]))
    try:
        engine.control(Set(overlap_decode_full_sm=True))
        engine.step()
        assert engine.config_record().levels == [(132, 0), (104, 132), (0, 132)]
        assert engine.config_record().overlap_decode_full_sm is True
        refused = engine.control(Set(manual_divisions=[]))  # overlap needs them
        engine.step()
        with pytest.raises(ControlError) as err:
            refused.result(0)
        assert err.value.field == "overlap_decode_full_sm"
        assert engine.config_record().levels == [(132, 0), (104, 132), (0, 132)]  # nothing changed
        engine.control(Set(overlap_decode_full_sm=False))
        engine.step()
        assert engine.config_record().levels == [(132, 0), (104, 28), (0, 132)]
    finally:
        engine.close()
    plain = build_engine("sim:H100")
    try:
        refused = plain.control(Set(overlap_decode_full_sm=True))
        plain.step()
        with pytest.raises(ControlError) as err:
            refused.result(0)
        assert err.value.field == "overlap_decode_full_sm"
    finally:
        plain.close()
