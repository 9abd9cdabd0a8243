"""`level_rule: slo`: the level with the fewest decode units that meets the ITL SLO, from a decode
step model learned online; SGLang's rule while it knows too little. On a synthetic landscape,
then in a real engine on sim:H100."""
from __future__ import annotations

import pytest

from pdtop.engine.errors import ConfigError
from pdtop.engine.records import PrefillProgress, RoundRecord
from pdtop.engine.scheduling.level_rule import MARGIN, MIN_SAMPLES, DecodeStepModel, SloRule
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable

TABLE = SplitTable.for_gpu(132, 9, PdmuxConfig())  # H100: 8 levels, 6 split levels
UNITS = 132
PROMPT = 8192


def step_s(decode_units: int, bs: int, ctx: int, beside_prefill: bool) -> float:
    """The landscape: bandwidth saturates at 48 SMs; a prefill beside decode costs it 20%."""
    speed = min(1.0, decode_units / 48)
    return (0.004 + 0.00005 * bs + 0.00002 * ctx / 1000) / speed * (1.2 if beside_prefill else 1.0)


def record(decode_units: int, bs: int, ctx: int, beside_prefill: bool, step: float | None = None) -> RoundRecord:
    """A round whose decode batch reads `ctx` KV tokens; beside a prefill, the pool also holds the
    8,192-token prompt being prefilled (decode does not read it)."""
    prefills = [PrefillProgress([1], PROMPT, 3, 36, 1)] if beside_prefill else []
    return RoundRecord(index=0, time=0.0, policy="pdmux", level=0, prefill_units=UNITS - decode_units,
                       decode_units=decode_units, pinned=False, decode_bs=bs,
                       decode_step_s=step_s(decode_units, bs, ctx, beside_prefill) if step is None else step,
                       round_s=0.01, prefills=prefills, tokens_emitted=bs, waiting=0, running=bs,
                       kv_used_tokens=ctx + (PROMPT if beside_prefill else 0),
                       kv_capacity_tokens=1 << 20, bytes_moved=0.0, flops=0.0)


def teach(model: DecodeStepModel, decode_units: int, beside_prefill: bool, n: int = MIN_SAMPLES) -> None:
    for i in range(n):
        bs = 24 + i
        model.observe(record(decode_units, bs, 40_000 + 3000 * (i * i % 5), beside_prefill))


def test_the_split_levels_of_the_landscape():
    assert [d for _, d in TABLE.groups[1:-1]] == [20, 28, 36, 44, 52, 60]


def test_fallback_to_sglang_while_the_model_has_too_few_rounds():
    rule = SloRule(DecodeStepModel(UNITS))
    config = PdmuxConfig(level_rule="slo", slo_itl_ms=8.0)
    teach(rule.model, UNITS, beside_prefill=False, n=MIN_SAMPLES - 1)
    assert rule.choose(TABLE, 30, True, config, 50_000) == TABLE.choose(30, True, config)
    assert "SGLang's rule until the model has 8 rounds (7 so far)" in rule.status


def test_it_picks_the_fewest_decode_units_meeting_the_slo_with_a_margin():
    model = DecodeStepModel(UNITS)
    teach(model, UNITS, beside_prefill=False)  # the baseline: decode alone on the whole device
    for d in (20, 28, 36, 44, 52, 60):
        teach(model, d, beside_prefill=True)
    rule = SloRule(model)
    bs, ctx = 30, 50_000
    slo_ms = 10.0
    level = rule.choose(TABLE, bs, True, PdmuxConfig(level_rule="slo", slo_itl_ms=slo_ms), ctx)
    decode = TABLE.groups[level][1]
    meets = [d for _, d in TABLE.groups[1:-1] if step_s(d, bs, ctx, True) <= 0.9 * slo_ms / 1e3]
    assert decode == min(meets) == 44  # SGLang's rule gives 30 * 6 // 36 = level 5 (52 SMs)
    assert level != TABLE.choose(bs, True, PdmuxConfig())
    assert rule.status.startswith("slo: level 4 predicted")
    assert rule.predicted_s[44] == pytest.approx(step_s(44, bs, ctx, True), rel=0.01)
    # an SLO no level meets: the most decode units
    assert rule.choose(TABLE, bs, True, PdmuxConfig(level_rule="slo", slo_itl_ms=1.0), ctx) == 6


def test_unvisited_levels_are_predicted_pessimistically():
    """Only the whole device's decode-only rounds known: a split level is its time scaled by
    units / decode units (never better than it really is beside a prefill), so what it picks
    meets the SLO; once that level has rounds of its own, a lighter one is scaled from it."""
    model = DecodeStepModel(UNITS)
    teach(model, UNITS, beside_prefill=False)
    rule = SloRule(model)
    bs, ctx = 30, 50_000
    for level in range(1, 7):
        d = TABLE.groups[level][1]
        predicted, own = model.predict(d, bs, ctx)
        assert not own and predicted >= step_s(d, bs, ctx, True)
    config = PdmuxConfig(level_rule="slo", slo_itl_ms=20.0)
    level = rule.choose(TABLE, bs, True, config, ctx)
    assert step_s(TABLE.groups[level][1], bs, ctx, True) <= 20e-3
    assert "no rounds of its own yet" in rule.status
    teach(model, TABLE.groups[level][1], beside_prefill=True)
    lighter = TABLE.groups[level - 1][1]
    assert model.predict(lighter, bs, ctx)[0] == pytest.approx(
        step_s(TABLE.groups[level][1], bs, ctx, True) * TABLE.groups[level][1] / lighter, rel=0.01)


def test_the_rule_is_pdtops_own_key_and_needs_its_slo(tmp_path):
    with pytest.raises(ConfigError, match="slo needs slo_itl_ms"):
        PdmuxConfig(level_rule="slo")
    with pytest.raises(ConfigError, match="level_rule"):
        PdmuxConfig(level_rule="fastest")
    with pytest.raises(ConfigError, match="slo_itl_ms"):
        PdmuxConfig(slo_itl_ms=-1)
    from pdtop.engine.scheduling.pdmux_config import dump_pdmux_config, load_pdmux_config

    path = tmp_path / "c.yaml"
    path.write_text(dump_pdmux_config(PdmuxConfig(level_rule="slo", slo_itl_ms=9.5)))
    assert load_pdmux_config(str(path)) == PdmuxConfig(level_rule="slo", slo_itl_ms=9.5,
                                                        split_forward_token_budget=65536)


def test_an_engine_on_sim_meets_the_slo_online_with_fewer_decode_units():
    """The seed's scenario on sim:H100 (32 decoding, 8,192-token prompts): SGLang's rule gives
    decode more SMs than the SLO needs; the online rule learns the landscape and takes fewer."""
    from pdtop.engine.build import build_engine

    def run(config: PdmuxConfig) -> tuple[list[int], list[float]]:
        engine = build_engine("sim:H100", config=config)
        try:
            reqs = [engine.submit(engine.prompts.make(2048), 4096, ignore_eos=True) for _ in range(32)]
            while any(not r.token_times for r in reqs):
                engine.step()
            for _ in range(10):  # decode-only rounds: the model's baseline
                engine.step()
            units, steps = [], []
            for _ in range(6):
                engine.submit(engine.prompts.make(8192), 4, ignore_eos=True)
                for _ in range(60):
                    rec = engine.step()
                    if rec.prefills and rec.decode_bs:
                        units.append(rec.decode_units)
                        steps.append(rec.decode_step_s)
            return units, steps
        finally:
            engine.close()

    sglang_units, _ = run(PdmuxConfig())
    slo_units, slo_steps = run(PdmuxConfig(level_rule="slo", slo_itl_ms=16.0))
    assert max(slo_steps) <= 16.0e-3
    assert max(slo_units) < min(sglang_units)  # 44 SMs against SGLang's 52 and 60


def test_the_rule_is_switched_live_and_back():
    """A `set` message turns the online rule on mid-run (refused without its SLO) and off again."""
    from pdtop.engine.build import build_engine
    from pdtop.engine.errors import ControlError
    from pdtop.engine.scheduling.commands import Set

    engine = build_engine("sim:H100")
    try:
        refused = engine.control(Set(level_rule="slo"))
        engine.step()
        with pytest.raises(ControlError, match="slo needs slo_itl_ms"):
            refused.result(0)
        assert engine.config.level_rule == "sglang"
        engine.control(Set(level_rule="slo", slo_itl_ms=16.0))
        engine.step()
        assert engine.config.level_rule == "slo" and engine.config.slo_itl_ms == 16.0
        engine.submit(engine.prompts.make(2048), 64, ignore_eos=True)
        engine.submit(engine.prompts.make(2048), 64, ignore_eos=True)
        for _ in range(20):
            engine.step()
        assert engine.scheduler.levels.status == "slo: one side idle, the whole device to the other"
        engine.submit(engine.prompts.make(2048), 64, ignore_eos=True)  # a prefill beside decode
        for _ in range(3):
            engine.step()
        assert engine.scheduler.levels.status.startswith("slo: level ")  # 20 decode-only rounds: a baseline
        engine.control(Set(level_rule="sglang"))
        for _ in range(5):
            engine.step()
        assert engine.config.level_rule == "sglang"
    finally:
        engine.close()


def test_bench_and_serve_refuse_the_rule_without_an_slo_in_one_line(capsys):
    from pdtop.cli import main

    assert main(["serve", "--device", "sim:H100", "--level-rule", "slo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pdtop serve: error: ") and "slo needs slo_itl_ms" in err
    # bench has an ITL SLO of its own (its goodput's, 20 ms on sim:): the rule meets that one
    assert main(["bench", "--device", "sim:H100", "--policy", "pdmux", "--quick", "--level-rule", "slo"]) == 0
    assert "ITL p99 <= 20 ms" in capsys.readouterr().out
    assert main(["serve", "--device", "sim:H100", "--level-rule", "slo", "--slo-itl-ms", "nan"]) == 2
    assert "slo_itl_ms: not a finite number: nan" in capsys.readouterr().err  # the decoder's words (was ours)


def taught_rule() -> SloRule:
    model = DecodeStepModel(UNITS)
    teach(model, UNITS, beside_prefill=False)
    for d in (20, 28, 36, 44, 52, 60):
        teach(model, d, beside_prefill=True)
    return SloRule(model)


def test_the_margin_is_the_models_measured_error_and_it_moves_the_choice():
    """10% until rounds have checked the model; then the p99 of measured / predicted, less 1: 3% too
    slow measured gives a ~3% margin, so a level the 10% margin refused is taken; 30% too slow
    widens it past 10%."""
    rule, bs, ctx = taught_rule(), 30, 50_000
    s44 = step_s(44, bs, ctx, True)
    config = PdmuxConfig(level_rule="slo", slo_itl_ms=s44 / 0.93 * 1e3)  # 44 SMs leave 7% of the SLO
    assert rule.margin == MARGIN
    assert TABLE.groups[rule.choose(TABLE, bs, True, config, ctx)][1] == 52
    for _ in range(MIN_SAMPLES):
        rule.learn(record(44, bs, ctx, True, step=s44 * 1.03), config, TABLE)
    assert 0.02 < rule.margin < 0.05
    assert TABLE.groups[rule.choose(TABLE, bs, True, config, ctx)][1] == 44
    for _ in range(MIN_SAMPLES):
        rule.learn(record(44, bs, ctx, True, step=s44 * 1.3), config, TABLE)
    assert rule.margin > 0.2
    assert TABLE.groups[rule.choose(TABLE, bs, True, config, ctx)][1] > 44
    untouched = taught_rule()  # under SGLang's rule nothing is checked
    for _ in range(MIN_SAMPLES):
        untouched.learn(record(44, bs, ctx, True, step=s44 * 1.3), PdmuxConfig(), TABLE)
    assert untouched.margin == MARGIN


def pace(rule: SloRule, decode_units: int, config: PdmuxConfig, layers: int, round_s: float) -> None:
    """`layers` rounds of an 8,192-token prefill beside decode, one layer done a round."""
    for done in range(1, layers + 1):
        r = record(decode_units, 30, 50_000, True)
        r.prefills, r.round_s = [PrefillProgress([7], PROMPT, done, 36, 1)], round_s
        rule.pace.add(((7,), None, PROMPT), round_s * r.prefill_units, done)  # as pdmux tells it after the round
        rule.learn(r, config, TABLE)


def test_prefill_advances_as_many_layers_as_the_slo_allows():
    """With a level the model trusts and the prefill's pace known, the slice is the most layers over
    which the predicted decode step, the batch's context growing by its size a round, meets the
    SLO and margin: all the layers left where there is room; fewer where the SLO is close; SGLang's
    own slice for a prefill's first one, under SGLang's rule, or at a level known only by scaling."""
    bs, ctx = 30, 50_000
    rule = taught_rule()
    roomy = PdmuxConfig(level_rule="slo", slo_itl_ms=10.0)
    pace(rule, 44, roomy, 4, 0.01)
    level = rule.choose(TABLE, bs, True, roomy, ctx)
    assert TABLE.groups[level][1] == 44 and rule.chosen is not None
    assert rule.slice_layers(4, 4, 36, roomy) == 32  # the rest in one slice
    assert rule.slice_layers(4, 0, 36, roomy) == 4  # its first slice: no pace yet
    assert rule.slice_layers(4, 4, 36, PdmuxConfig()) == 4  # SGLang's rule
    # slow layers (0.5 s each: ~60 decode rounds) and an SLO 5% above the level's step: context grows
    rule = taught_rule()
    predicted = rule.model.predict(44, bs, ctx)[0]
    tight = PdmuxConfig(level_rule="slo", slo_itl_ms=predicted / (1 - MARGIN) * 1.05 * 1e3)
    pace(rule, 44, tight, 4, 0.5)
    assert TABLE.groups[rule.choose(TABLE, bs, True, tight, ctx)][1] == 44
    n = rule.slice_layers(4, 4, 36, tight)
    goal, layer_s = (1 - rule.margin) * tight.slo_itl_ms / 1e3, rule.pace.layer_s(UNITS - 44)
    assert layer_s == pytest.approx(0.5)

    def end_step(layers: int) -> float:
        return rule.model.predict(44, bs, ctx + int(bs * layers * layer_s / predicted))[0]

    assert 1 < n < 32 and end_step(n) <= goal < end_step(n + 1)
    closer = tight.replace(slo_itl_ms=tight.slo_itl_ms * 0.96)
    assert rule.slice_layers(4, 4, 36, closer) == 1  # room for one layer at a time
    # a level known only by scaling from another: SGLang's slice, so it is checked again soon
    rule = SloRule(DecodeStepModel(UNITS))
    teach(rule.model, UNITS, beside_prefill=False)
    pace(rule, 60, roomy, 4, 0.01)
    rule.choose(TABLE, bs, True, PdmuxConfig(level_rule="slo", slo_itl_ms=20.0), ctx)
    assert rule.chosen is None and rule.slice_layers(4, 4, 36, roomy) == 4
