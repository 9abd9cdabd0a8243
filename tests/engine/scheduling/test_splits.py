"""SGLang's split and selection rules (the seed's tables), the CPU levels and manual divisions."""

import pytest

from pdtop.engine.errors import ConfigError, DeviceError
from pdtop.engine.roofline.partition import divide_sm, stream_groups
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import (
    SplitTable,
    choose,
    choose_manual,
    cpu_groups,
    manual_groups,
    prefill_layers_per_step,
)

# The seed's printed output.
SEED_GROUPS = {
    (132, 9): [(132, 0), (112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60), (0, 132)],
    (108, 8): [(108, 0), (84, 24), (78, 30), (72, 36), (66, 42), (60, 48), (54, 54), (0, 108)],
    (78, 9): [(78, 0), (56, 22), (48, 30), (40, 38), (0, 78)],
}
SEED_H100_CHOICE = {1: 1, 6: 1, 12: 2, 18: 3, 24: 4, 30: 5, 36: 6, 64: 6}
SEED_LAYERS = {512: 36, 8192: 8, 32768: 2, 131072: 1}


@pytest.mark.parametrize("sms,major", list(SEED_GROUPS))
def test_seed_stream_groups(sms, major):
    assert stream_groups(sms, major) == SEED_GROUPS[(sms, major)]


def test_seed_h100_selection():
    groups = stream_groups(132, 9)
    picked = {bs: choose(groups, bs, has_prefill=True) for bs in SEED_H100_CHOICE}
    assert picked == SEED_H100_CHOICE
    assert groups[choose(groups, 32, True)] == (80, 52)


def test_seed_whole_device_when_one_side_idle():
    groups = stream_groups(132, 9)
    assert groups[choose(groups, 32, False)] == (0, 132)
    assert groups[choose(groups, 0, True)] == (132, 0)
    assert choose(groups, 0, False) == 0


def test_seed_divisor_exercise():
    # Exercise 2: with decode_bs_divisor 24 the 72:60 level is chosen at 24 requests, not before.
    groups = stream_groups(132, 9)
    assert choose(groups, 24, True, decode_bs_divisor=24) == 6
    assert choose(groups, 23, True, decode_bs_divisor=24) == 5
    assert choose(groups, 35, True) == 5


@pytest.mark.parametrize("tokens,layers", SEED_LAYERS.items())
def test_seed_layers_per_round(tokens, layers):
    assert prefill_layers_per_step(tokens, 36) == layers


def test_layers_per_round_budget():
    assert prefill_layers_per_step(8192, 36, token_budget=16384) == 2
    assert prefill_layers_per_step(100, 30, token_budget=65536) == 30
    assert prefill_layers_per_step(10**6, 30, token_budget=1) == 1


GRANULARITY = {7: (2, 2), 8: (4, 2), 9: (8, 8)}


@pytest.mark.parametrize("major", [7, 8, 9])
def test_divide_sm_properties(major):
    min_part, step = GRANULARITY[major]
    for total in range(40, 201):
        for groups in (1, 3, 6, 10):
            # every valid prefill count, by brute force over all counts
            valid = [x for x in range(total + 1)
                     if x >= min_part and total - x >= min_part and (x - min_part) % step == 0
                     and 2 * x >= total and total - x >= 16]
            splits = divide_sm(total, major, groups)
            assert len(splits) == min(groups, len(valid)), (total, groups)
            prefill = [p for p, _ in splits]
            assert prefill == sorted(set(prefill), reverse=True)
            for p, d in splits:
                assert p + d == total and p in valid
                assert 2 * p >= total and d >= 16 and p % (8 if major == 9 else 2) == 0


def test_newer_architectures_behave_like_hopper():
    for total in range(40, 201):
        for major in (10, 12):
            assert stream_groups(total, major) == stream_groups(total, 9)
            assert divide_sm(total, major, 3) == divide_sm(total, 9, 3)


def test_unsupported_or_too_small_is_a_clear_error():
    with pytest.raises(DeviceError, match="compute capability 5"):
        stream_groups(132, 5)
    with pytest.raises(DeviceError, match="31 SMs"):
        stream_groups(31, 9)
    with pytest.raises(DeviceError, match="SMs"):
        stream_groups(0, 9)
    for groups in (0, -1, 2.5):  # sm_group_num 2 and below: PdmuxConfig refuses them; a direct call too
        with pytest.raises(DeviceError, match="split groups"):
            divide_sm(132, 9, groups)  # type: ignore[arg-type]


MANUAL = [[112, 20, 1], [96, 36, 16], [72, 56, 32]]


def test_manual_groups_keep_the_order_and_add_whole_device_levels():
    assert manual_groups(132, MANUAL) == [(132, 0), (112, 20), (96, 36), (72, 56), (0, 132)]


@pytest.mark.parametrize("bs,level", [(1, 1), (15, 1), (16, 2), (31, 2), (32, 3), (500, 3)])
def test_manual_thresholds(bs, level):
    assert choose_manual(MANUAL, bs, has_prefill=True) == level


def test_manual_below_every_threshold_and_idle_sides():
    divisions = [[104, 28, 4], [80, 52, 20]]
    assert choose_manual(divisions, 2, True) == 1  # SGLang leaves this unassigned; pdtop uses level 1
    assert choose_manual(divisions, 20, True) == 2
    assert choose_manual(divisions, 7, False) == 3
    assert choose_manual(divisions, 0, True) == 0


def test_cpu_levels_on_two_cores():
    assert cpu_groups(2) == [(2, 0), (1, 1), (0, 2)]


def test_cpu_level_rule():
    for cores in range(2, 65):
        groups = cpu_groups(cores)
        assert groups[0] == (cores, 0) and groups[-1] == (0, cores)
        splits = groups[1:-1]
        assert 1 <= len(splits) <= 6
        assert splits == sorted(set(splits), reverse=True)
        for p, d in splits:
            assert p + d == cores and d >= 1 and 2 * p >= cores
    assert len(cpu_groups(16)[1:-1]) == 6
    assert len(cpu_groups(16, sm_group_num=4)[1:-1]) == 2


def test_cpu_needs_two_cores():
    with pytest.raises(DeviceError, match="at least 2 cores"):
        cpu_groups(1)


def test_split_table_automatic():
    config = PdmuxConfig()
    table = SplitTable.for_gpu(132, 9, config)
    assert table.groups == SEED_GROUPS[(132, 9)] and table.unit_name == "SMs" and not table.manual
    assert table.units == 132
    assert {bs: table.choose(bs, True, config) for bs in SEED_H100_CHOICE} == SEED_H100_CHOICE
    assert table.choose(24, True, config.replace(decode_bs_divisor=24)) == 6
    assert table.choose(5, False, config) == 7
    cpu = SplitTable.for_cpu(2, config)
    assert cpu.groups == [(2, 0), (1, 1), (0, 2)] and cpu.unit_name == "cores"
    assert cpu.choose(30, True, config) == 1


def test_split_table_manual():
    config = PdmuxConfig(sm_group_num=5, manual_divisions=MANUAL)
    table = SplitTable.for_gpu(132, 9, config)
    assert table.manual and table.groups == manual_groups(132, MANUAL)
    assert [table.choose(bs, True, config) for bs in (1, 16, 40)] == [1, 2, 3]
    assert table.choose(40, False, config) == 4
    assert table.rebuilt(PdmuxConfig()).groups == SEED_GROUPS[(132, 9)]


def test_manual_divisions_must_fit_the_device():
    config = PdmuxConfig(sm_group_num=5, manual_divisions=MANUAL)
    with pytest.raises(ConfigError) as err:
        SplitTable.for_gpu(108, 8, config)
    assert err.value.field == "manual_divisions" and "108" in str(err.value)
    with pytest.raises(ConfigError, match="manual_divisions"):
        SplitTable.for_cpu(2, config)
    with pytest.raises(ConfigError, match="at least 1"):
        SplitTable.for_gpu(132, 9, PdmuxConfig(sm_group_num=3, manual_divisions=[[132, 0, 1]]))
    assert SplitTable.for_cpu(2, PdmuxConfig(sm_group_num=3, manual_divisions=[[1, 1, 1]])).groups == cpu_groups(2)


def run_levels(*args):
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([sys.executable, "-m", "pdtop", "levels", *args], cwd=Path(__file__).resolve().parents[3],
                          capture_output=True, text=True, timeout=120)


def test_levels_command_json_and_text():
    import json
    import os

    out = run_levels("--sms", "78", "--cc", "9.0", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["groups"] == [list(g) for g in SEED_GROUPS[(78, 9)]]
    assert (data["sms"], data["cc"], data["sm_group_num"]) == (78, "9.0", 8)
    text = run_levels("--gpu", "H100")
    assert text.returncode == 0 and "decode bs  30 -> level 5 (80, 52)" in text.stdout
    cpu = run_levels("--device", "cpu", "--json")
    cores = len(os.sched_getaffinity(0))
    if cores >= 2:
        assert json.loads(cpu.stdout)["groups"] == [list(g) for g in cpu_groups(cores)]


@pytest.mark.parametrize("args", [["--sms", "132"], ["--sms", "132", "--cc", "5.0"],
                                  ["--gpu", "H100", "--device", "cpu"], ["--sm-group-num", "2"],
                                  ["--config", "/nonexistent/pdmux.yaml"]])
def test_levels_command_bad_input(args):
    out = run_levels(*args)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
