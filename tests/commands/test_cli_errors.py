"""Commands fail on bad input in one line with exit status 2, and stop quietly when their reader goes."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pdtop.cli import main


@pytest.fixture
def bad_models(tmp_path, mamba_gguf):
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    return {"missing": (str(tmp_path / "nope.gguf"), "model file not found"),
            "not gguf": (str(text), "not a GGUF file"),
            "unsupported": (str(mamba_gguf), "unsupported architecture 'mamba'")}


def _one_error_line(args: list[str], capsys) -> str:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("which", ["missing", "not gguf", "unsupported"])
@pytest.mark.parametrize("command", ["serve", "dashboard"])
def test_a_bad_model_is_one_line_and_exit_2(command, which, bad_models, capsys):
    path, words = bad_models[which]
    line = _one_error_line([command, "--device", "sim:H100", "--port", "0", "--model", path]
                           if command == "serve" else ["--device", "sim:H100", "--model", path], capsys)
    assert line.startswith(f"pdtop {command}: error: ") and words in line


@pytest.mark.parametrize("args, words", [
    (["--device", "sim:H100", "--speed", "0"], "--speed must be in (0, 1000]"),
    (["--device", "cpu", "--speed", "0.1"], "--speed applies to simulated devices"),
    (["--speed", "0.1"], "--speed applies to simulated devices"),
])
@pytest.mark.parametrize("command", ["serve", "dashboard"])
def test_bad_speed_is_one_line_and_exit_2(command, args, words, capsys):
    assert words in _one_error_line([command, *args], capsys)


@pytest.mark.parametrize("args", [["levels"], ["levels", "--json"], ["estimate"], ["estimate", "--json"]])
def test_a_closed_pipe_ends_the_command_quietly(args):
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes (`pdtop levels | head -0`)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(30) == 141 and err == ""


@pytest.mark.parametrize("command", [["levels"], ["bench", "--policy", "pdmux"], ["estimate"]])
@pytest.mark.parametrize("device", ["sim:H100", "cpu"])
def test_divisions_that_do_not_fit_the_device_name_the_file(command, device, tmp_path, capsys):
    """Issue 25 item 20: "pdmux config: manual_divisions: entry 0 [200, 10] uses 210 SMs" dropped the file."""
    if command[0] == "estimate" and device == "cpu":
        pytest.skip("estimate is for GPUs")
    path = tmp_path / "too-big.yaml"
    path.write_text("sm_group_num: 3\nmanual_divisions: [[200, 10, 1]]\n")
    where = ["--gpu", "H100"] if command[0] == "estimate" else ["--device", device]
    line = _one_error_line([*command, *where, "--config", str(path)], capsys)
    assert f"pdmux config {path}: manual_divisions: entry 0 [200, 10] uses 210" in line, line


@pytest.mark.parametrize("args, command, unknown", [
    (["kv", "--bogus"], "kv", "--bogus"),
    (["estimate", "--s-sats", "44"], "estimate", "--s-sats 44"),
    (["bench", "--device", "sim:H100", "extra"], "bench", "extra"),
    (["--bogus"], "dashboard", "--bogus"),  # no subcommand: the dashboard's options
])
def test_an_unknown_option_gets_the_subcommands_usage(args, command, unknown):
    """Issue 42 item 19: `pdtop kv --bogus` printed the top-level usage (`pdtop [-h] [--version] COMMAND`)."""
    proc = subprocess.run([sys.executable, "-m", "pdtop", *args], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert lines[0].startswith(f"usage: pdtop {command} ") and "COMMAND" not in proc.stderr
    assert lines[-1] == f"pdtop {command}: error: unrecognized arguments: {unknown}"
