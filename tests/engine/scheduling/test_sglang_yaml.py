"""SGLang's own pdmux YAML files (copied under tests/data/sglang_pdmux/, each naming its source) load and
mean in pdtop what they mean in SGLang; what SGLang's loader and `initialize_stream_groups` refuse
(sgl-project/sglang @ 337ee8ed: python/sglang/srt/multiplex/pdmux_context.py, as its
test_pdmux_overlap_streams.py exercises it) pdtop refuses too, in one line with exit 2 on the CLI."""
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


# What SGLang refuses. (SGLang also requires the sm_group_num key; pdtop infers it, docs/levels.md.)
REFUSED = [
    ("sm_group_num: 2\n", "sm_group_num"),
    ("sm_group_num: 8\nmanual_divisions: [[80, 52, 1]]\n", "manual_divisions"),  # must have 6 entries
    ("sm_group_num: 3\noverlap_decode_full_sm: true\n", "overlap_decode_full_sm"),  # requires manual_divisions
    ("sm_group_num: 3\nmanual_divisions: [[80, 52]]\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[0, 132, 1]]\n", "manual_divisions"),  # prefill_sm must be positive
    ("sm_group_num: 3\nmanual_divisions: [[0, 132, 1]]\noverlap_decode_full_sm: true\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[104, 0, 1]]\n", "manual_divisions"),  # decode_sm must be positive
    ("sm_group_num: 3\nmanual_divisions: [[104, -1, 1]]\noverlap_decode_full_sm: true\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[104, 28, -1]]\n", "manual_divisions"),  # threshold non-negative
    ("sm_group_num: 4\nmanual_divisions: [[104, 28, 4], [80, 52, 4]]\n", "manual_divisions"),  # increasing
    ("sm_group_num: 3\nsplit_forward_token_budget: 0\n", "split_forward_token_budget"),
    ("sm_group_num: 3\ndecode_bs_divisor: 0\n", "decode_bs_divisor"),
    ("sm_group_num: 3\nmax_split_forward_layers: -1\n", "max_split_forward_layers"),  # SGLang's test's values
    ("sm_group_num: 3\nmax_split_forward_layers: 1.5\n", "max_split_forward_layers"),
    ("sm_group_num: 3\nmax_split_forward_layers: true\n", "max_split_forward_layers"),
    # pdtop's own: SGLang takes any truthy value, so the string "false" would switch overlap on
    ("sm_group_num: 3\nmanual_divisions: [[104, 28, 1]]\noverlap_decode_full_sm: 'false'\n", "overlap_decode_full_sm"),
]


@pytest.mark.parametrize("text,field", REFUSED)
def test_what_sglang_refuses_is_refused(tmp_path, text, field):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(str(path))
    assert err.value.field == field and str(path) in str(err.value)


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


@pytest.mark.parametrize("text", [text for text, _ in REFUSED[:3]] + [REFUSED[-3][0], REFUSED[-1][0]])
def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys, text):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    assert main(["levels", "--gpu", "H100", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pdtop levels: error: ") and str(path) in err


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
    bad.write_text("sm_group_num: 3\noverlap_decode_full_sm: true\n")
    assert main([*command, "--device", "sim:H100", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "overlap_decode_full_sm" in lines[0] and "Traceback" not in err, err
