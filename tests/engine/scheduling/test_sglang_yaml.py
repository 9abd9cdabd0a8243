"""SGLang's own pdmux YAML files (copied under tests/data/sglang_pdmux/, each naming its source) and files
written as its users write them (tests/data/sglang_pdmux/users/) load and mean in pdtop what they mean in
SGLang 0.5.23 (python/sglang/srt/multiplex/pdmux_context.py and multiplexing_mixin.py as released); pdtop
refuses only what the release refuses or fails on, in one line with exit 2 on the CLI, and says in one
warning line each where newer SGLang (sgl-project/sglang @ 337ee8ed, as its test_pdmux_overlap_streams.py
exercises it) reads a file otherwise."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdtop.cli import main
from pdtop.engine.errors import ConfigError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config
from pdtop.engine.scheduling.splits import SplitTable

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang_pdmux"


def data(name: str) -> str:
    return str(DATA / name)


# file -> (SMs of the GPU it was written for, levels SGLang makes (its SM_COUNTS), thresholds, cap, overlap)
MEANING = {
    "h200_manual.yaml": (132, [(132, 0), (112, 20), (104, 28), (96, 36), (80, 52), (64, 68), (56, 76), (0, 132)],
                         (1, 5, 10, 15, 20, 25), 0, False),
    "overlap_full_device_decode.yaml": (132, [(132, 0), (104, 132), (0, 132)], (0,), 0, True),
    "layer_cap.yaml": (132, [(132, 0), (104, 28), (0, 132)], (1,), 2, False),
    "overlay_78sm.yaml": (78, [(78, 0), (24, 78), (40, 78), (0, 78)], (1, 8), 0, True),
    "exclusive_78sm.yaml": (78, [(78, 0), (56, 22), (48, 30), (40, 38), (32, 46), (24, 54), (16, 62), (0, 78)],
                            (1, 2, 3, 4, 6, 8), 0, False),
    "overlap_layer_cap.yaml": (132, [(132, 0), (104, 132), (0, 132)], (0,), 2, True),
}


@pytest.mark.parametrize("name", sorted(MEANING))
def test_sglang_files_load_and_mean_the_same(name):
    sms, levels, thresholds, cap, overlap = MEANING[name]
    config = load_pdmux_config(data(name))
    assert (config.max_split_forward_layers, config.overlap_decode_full_sm) == (cap, overlap)
    table = SplitTable.for_gpu(sms, 9, config)
    assert table.groups == levels and table.thresholds == thresholds and table.manual


def test_every_sglang_file_of_the_data_folder_is_checked():
    assert {p.name for p in DATA.glob("*.yaml")} == set(MEANING) | {"oversubscribed_exclusive.yaml"}
    assert all("sglang" in p.read_text().lower() for p in DATA.glob("*.yaml"))  # each names its source


def test_overlap_realizes_as_sglang_carves_it():
    """SGLang's test: a (104, 28) green-context pair for prefill, decode on the whole device: (104, 132)."""
    out = run_levels(["--gpu", "H100", "--config", data("overlap_full_device_decode.yaml"), "--json"])
    assert out["groups"] == [[132, 0], [104, 132], [0, 132]]
    assert out["realized"] == [[132, 0], [104, 132], [0, 132]]


def run_levels(args):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["levels", *args]) == 0
    return json.loads(buf.getvalue())


def release_stream_idx(config: PdmuxConfig, groups: int, decode_bs: int) -> int:
    """SGLang 0.5.23's adjust_stream_groups while a split prefill runs beside decode, rule for rule: with
    manual divisions `stream_idx = i + 1` for every row whose threshold decode_bs reaches (the last one
    stays; none leaves it unbound: UnboundLocalError), else the divisor's rule over `groups` levels."""
    rows = config.manual_divisions
    if rows:
        found = None
        for i, (_, _, threshold) in enumerate(rows):
            if decode_bs >= threshold:
                found = i + 1
        if found is None:
            raise UnboundLocalError("stream_idx")
        return found
    return max(1, min(groups - 2, decode_bs * (groups - 2) // config.decode_bs_divisor))


USERS = DATA / "users"
# user file -> the warnings' subjects (each warning one line naming a version)
USER_FILES = {
    "zero_thresholds.yaml": ["do not increase"],
    "repeated_thresholds.yaml": ["do not increase"],
    "decreasing_thresholds.yaml": ["do not increase"],
    "unknown_keys.yaml": ["model, decode_bs_divizor", "max_split_forward_layers"],
    "first_threshold_8.yaml": ["UnboundLocalError"],
    "rule_only.yaml": [],
}


@pytest.mark.parametrize("name", sorted(USER_FILES))
def test_files_written_as_users_write_them_load_with_the_releases_meaning(name):
    """Issue 40: three of six real files were refused ("thresholds must increase"). Each loads, picks the
    level the release picks for every decode batch the release has a level for, and each difference
    with newer SGLang, or failure of the release, is one warning line that names the version."""
    said: list[str] = []
    config = load_pdmux_config(str(USERS / name), said.append)
    table = SplitTable.for_gpu(132, 9, config)
    for bs in range(1, 80):
        try:
            expected = release_stream_idx(config, len(table.groups), bs)
        except UnboundLocalError:
            assert name == "first_threshold_8.yaml" and bs < 8
            continue
        assert table.choose(bs, True, config) == expected, (name, bs)
    assert len(said) == len(USER_FILES[name]), said
    for line, subject in zip(said, USER_FILES[name], strict=True):
        assert subject in line and "\n" not in line and str(USERS / name) in line
        assert "0.5.23" in line or "337ee8ed" in line
    assert all("sglang" in p.read_text().lower() for p in USERS.glob("*.yaml"))
    assert {p.name for p in USERS.glob("*.yaml")} == set(USER_FILES)


def test_last_matching_row_wins_with_equal_and_zero_thresholds():
    config = load_pdmux_config(str(USERS / "zero_thresholds.yaml"), lambda _: None)
    table = SplitTable.for_gpu(132, 9, config)
    assert {table.groups[table.choose(bs, True, config)] for bs in (1, 5, 64)} == {(72, 60)}
    config = load_pdmux_config(str(USERS / "repeated_thresholds.yaml"), lambda _: None)
    assert [SplitTable.for_gpu(132, 9, config).choose(bs, True, config) for bs in (1, 15, 16, 40)] == [1, 1, 3, 3]


def test_the_cli_takes_a_users_file_and_warns_on_stderr(capsys, monkeypatch):
    from pdtop.engine.scheduling import pdmux_config

    monkeypatch.setattr(pdmux_config, "_warned", set())  # once per process
    path = str(USERS / "zero_thresholds.yaml")
    out = run_levels(["--gpu", "H100", "--config", path, "--json"])
    assert out["groups"] == [[132, 0], [112, 20], [96, 36], [72, 60], [0, 132]]
    err = capsys.readouterr().err
    assert "pdtop: warning:" in err and "do not increase" in err and "Traceback" not in err


# What SGLang 0.5.23 refuses (its loader), or fails on when it builds the levels (green contexts).
REFUSED = [
    ("sm_group_num: 2\n", "sm_group_num"),
    ("sm_group_num: 8\nmanual_divisions: [[80, 52, 1]]\n", "manual_divisions"),  # must have 6 entries
    ("manual_divisions: [[80, 52, 1]]\n", "sm_group_num"),  # "Missing required field: sm_group_num"
    ("sm_group_num: 3\nmanual_divisions: [[80, 52]]\n", "manual_divisions"),  # unpacked as 3 at init
    ("sm_group_num: 3\nmanual_divisions: [[0, 132, 1]]\n", "manual_divisions"),  # prefill_sm must be positive
    ("sm_group_num: 3\nmanual_divisions: [[0, 132, 1]]\noverlap_decode_full_sm: true\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[104, 0, 1]]\n", "manual_divisions"),  # decode_sm must be positive
    ("sm_group_num: 3\nmanual_divisions: [[104, -1, 1]]\noverlap_decode_full_sm: true\n", "manual_divisions"),
    ("sm_group_num: 3\ndecode_bs_divisor: 0\n", "decode_bs_divisor"),  # ZeroDivisionError at the first split
]


@pytest.mark.parametrize("text,field", REFUSED)
def test_what_sglang_refuses_is_refused(tmp_path, text, field):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(str(path))
    assert err.value.field == field and str(path) in str(err.value) and "0.5.23" in str(err.value)


# What the release takes and newer SGLang refuses or reads otherwise: taken as the release takes it
# (the newer key skipped where newer SGLang would refuse the file), with one warning line.
ACCEPTED = [
    ("sm_group_num: 3\noverlap_decode_full_sm: true\n", "overlap_decode_full_sm", {"overlap_decode_full_sm": False}),
    ("sm_group_num: 3\nmanual_divisions: [[104, 28, -1]]\n", None, {"manual_divisions": [[104, 28, -1]]}),
    ("sm_group_num: 4\nmanual_divisions: [[104, 28, 1], [80, 52, 1]]\n", "manual_divisions", {}),
    ("sm_group_num: 3\nsplit_forward_token_budget: 0\n", "split_forward_token_budget",
     {"split_forward_token_budget": 1}),
    ("sm_group_num: 3\nmax_split_forward_layers: -1\n", "max_split_forward_layers", {"max_split_forward_layers": 0}),
    ("sm_group_num: 3\nmax_split_forward_layers: 1.5\n", "max_split_forward_layers", {"max_split_forward_layers": 0}),
    ("sm_group_num: 3\nmax_split_forward_layers: true\n", "max_split_forward_layers", {"max_split_forward_layers": 0}),
    ("sm_group_num: 3\nmax_split_forward_layers: 2\n", "max_split_forward_layers", {"max_split_forward_layers": 2}),
    # SGLang main takes any truthy value (the string "false" would switch overlap on); the release skips it
    ("sm_group_num: 3\nmanual_divisions: [[104, 28, 1]]\noverlap_decode_full_sm: 'false'\n",
     "overlap_decode_full_sm", {"overlap_decode_full_sm": False}),
    ("sm_group_num: 3\nmanual_divisions: [[104, 28, 1]]\ndecode_bs_divisor: 0\n", "decode_bs_divisor",
     {"decode_bs_divisor": 36}),  # unused beside manual divisions
]


@pytest.mark.parametrize("text,warned,values", ACCEPTED)
def test_what_the_release_takes_is_taken_with_one_warning_line(tmp_path, text, warned, values):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    said: list[str] = []
    config = load_pdmux_config(str(path), said.append)
    assert {k: getattr(config, k) for k in values} == values
    assert ([warned] if warned else []) == [line.split(": ")[1] for line in said], said
    assert all("\n" not in line and ("0.5.23" in line or "337ee8ed" in line) for line in said)


@pytest.mark.parametrize("config,sms", [
    (PdmuxConfig(sm_group_num=3, manual_divisions=[[132, 132, 0]], overlap_decode_full_sm=True), 132),  # not < total
    (load_pdmux_config(data("oversubscribed_exclusive.yaml")), 132),  # 104 + 132 SMs without overlap
])
def test_what_sglang_refuses_when_it_makes_the_levels_is_refused(config, sms):
    with pytest.raises(ConfigError) as err:
        SplitTable.for_gpu(sms, 9, config)
    assert err.value.field == "manual_divisions"
    with pytest.raises(ConfigError):
        SplitTable.for_cpu(2, config)


@pytest.mark.parametrize("text", [REFUSED[0][0], REFUSED[1][0], REFUSED[2][0], REFUSED[-1][0]])
def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys, text):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    assert main(["levels", "--gpu", "H100", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pdtop levels: error: ") and str(path) in err


def test_a_yaml_bomb_in_config_is_refused_in_one_short_line(tmp_path, capsys):
    """Issue 38 item 8: the error repr'd the value, expanding every alias (a 382-byte file: 28.7 s, 1.76 GB,
    350 MB of error text). SGLang's files hold no anchor or alias: pdtop refuses them, at the first."""
    from tests.conftest import yaml_bomb

    path = tmp_path / "bomb.yaml"
    path.write_text(f"sm_group_num: {yaml_bomb(6)}\n")
    assert main(["levels", "--gpu", "H100", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400 and "an anchor (&a)" in err and "SGLang's pdmux files" in err


def test_every_error_shows_a_value_short(tmp_path):
    """Without aliases a value is no larger than the file, and an error still names it in a few words."""
    path = tmp_path / "long.yaml"
    path.write_text(f"sm_group_num: {'7' * 3000}x\nmanual_divisions: [{'[1, 2, 3], ' * 3000}[1, 2]]\n"
                    f"{'k' * 1000}: 1\n")  # PyYAML's simple keys end at 1024 characters
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(str(path), lambda line: None)
    assert err.value.field == "sm_group_num" and len(str(err.value)) < 300


def test_the_cli_refuses_an_oversubscribed_division_in_one_line(capsys):
    assert main(["levels", "--gpu", "H100", "--config", data("oversubscribed_exclusive.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "manual_divisions" in err and "132" in err


def test_overlap_needs_divisions_live_too():
    config = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 0, 0]], overlap_decode_full_sm=True)
    with pytest.raises(ConfigError) as err:
        config.replace(manual_divisions=[])
    assert err.value.field == "overlap_decode_full_sm"
    assert config.replace(overlap_decode_full_sm=False, manual_divisions=[[104, 28, 0]]).manual_divisions == \
        [[104, 28, 0]]


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["dashboard"]])
def test_serve_and_the_dashboard_take_sglangs_files(command):
    """The issue's `unknown keys` from serve and the dashboard: their --config check takes both keys."""
    from pdtop.cli import build_parser
    from pdtop.commands.serve import check_inputs

    args = build_parser().parse_args([*command, "--device", "sim:H100", "--config", data("overlap_layer_cap.yaml")])
    config = check_inputs(args)
    assert (config.max_split_forward_layers, config.overlap_decode_full_sm) == (2, True)


def test_bench_runs_sglangs_file(capsys):
    assert main(["bench", "--device", "sim:H100", "--policy", "pdmux", "--long-prompts", "1", "--json",
                 "--config", data("overlap_layer_cap.yaml")]) == 0
    assert list(json.loads(capsys.readouterr().out)["results"]) == ["pdmux"]


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["dashboard"], ["bench"]])
def test_serve_bench_and_the_dashboard_refuse_in_one_line(tmp_path, capsys, command):
    bad = tmp_path / "pdmux.yaml"
    bad.write_text("sm_group_num: 2\n")
    assert main([*command, "--device", "sim:H100", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "sm_group_num" in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("major", [10, 12])
def test_compute_capability_10_and_12_have_no_automatic_split_in_the_release(capsys, monkeypatch, major):
    """SGLang 0.5.23's get_arch_constraints raises "Unsupported compute capability" there: pdtop's own
    engine keeps the 9.x rule and says so in one line; tune searches and writes manual divisions only."""
    from pdtop.bench.policy_bench import SCENARIOS
    from pdtop.engine.scheduling import pdmux_config
    from pdtop.tune.space import pdmux_space

    monkeypatch.setattr(pdmux_config, "_warned", set())  # once per process: this test's process may have said it
    table = SplitTable.for_gpu(148, major, PdmuxConfig())
    assert table.groups == SplitTable.for_gpu(148, 9, PdmuxConfig()).groups
    err = capsys.readouterr().err
    assert f"compute capability {major}.x: SGLang 0.5.23 has no automatic split" in err and err.count("\n") <= 1
    manual = SplitTable.for_gpu(148, major, PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 44, 1]]))
    space = pdmux_space(manual, SCENARIOS["sim"], 36)
    assert {f.name for f in space.families} == {"manual", "manual2"}
    assert any("manual divisions only" in note and "0.5.23" in note for note in space.notes)
