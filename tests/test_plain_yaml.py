"""The YAML files pdtop reads (`--config`, themes, tune's `--workload`): plain data, bounded, each refusal one
short line (issue 38 item 8: a 382-byte file of nested aliases took 28.7 s and 1.76 GB and printed 350 MB)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdtop.plain_yaml import MAX_BYTES, MAX_DEPTH, YamlError, load_yaml, read_yaml
from tests.conftest import yaml_bomb

DATA = Path(__file__).resolve().parent / "data" / "sglang_pdmux"
THEMES = Path(__file__).resolve().parents[1] / "themes"


def test_a_yaml_bomb_is_refused_at_its_first_anchor_in_one_short_line():
    text = f"sm_group_num: {yaml_bomb(7)}\n"
    assert len(text) < 400
    with pytest.raises(YamlError) as refused:
        load_yaml(text)
    line = str(refused.value)
    assert line.startswith("line 1: an anchor (&a)") and "SGLang's pdmux files" in line
    assert "\n" not in line and len(line) < 200


@pytest.mark.parametrize("text, words", [
    ("a: &x 3\nb: 4\n", "line 1: an anchor (&x)"),  # an anchor alone expands nothing, but no file of ours has one
    ("a: 3\nb: *x\n", "line 2: an alias (*x)"),
    ("[" * 100_000, f"line 1: nested deeper than {MAX_DEPTH} levels"),  # PyYAML's composer recurses a level
    ("a: [8\n", "not valid YAML at line 2: expected ',' or ']'"),
    ("a: 1\n\x1b[2J: 2\n", "not valid YAML: unacceptable character #x001b"),
    ("a: " + "9" * 5000 + "\n", "not valid YAML: Exceeds the limit (4300 digits)"),  # a ValueError, not YAML's
    ("{[1]: 2}", "not valid YAML at line 1: found unhashable key"),
])
def test_what_is_not_plain_yaml_is_one_line(text, words):
    with pytest.raises(YamlError) as refused:
        load_yaml(text)
    assert str(refused.value).startswith(words) and "\n" not in str(refused.value) and len(str(refused.value)) < 200


def test_a_file_is_read_up_to_its_bound_and_as_utf_8(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_BYTES // 10 + 1))
    with pytest.raises(YamlError, match="larger than 256 KiB"):
        read_yaml(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(YamlError, match=r"^not UTF-8 text \(byte 9\)$"):
        read_yaml(latin)
    with pytest.raises(OSError):
        read_yaml(tmp_path / "missing.yaml")


def test_the_files_pdtop_reads_mean_what_safe_load_makes_of_them():
    files = [*DATA.glob("*.yaml"), *(DATA / "users").glob("*.yaml"), *THEMES.glob("*.yaml")]
    assert len(files) > 10
    for path in files:
        assert read_yaml(path) == yaml.safe_load(path.read_text()), path
    assert load_yaml("") is None
