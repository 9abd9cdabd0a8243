"""PdmuxConfig: SGLang-compatible YAML, per-field validation, live replacement."""
import pytest

from pdtop.engine.errors import ConfigError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config, validate


def write(tmp_path, text, name="pdmux.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_match_sglang():
    c = PdmuxConfig()
    assert (c.sm_group_num, c.manual_divisions, c.split_forward_token_budget, c.decode_bs_divisor, c.chunk_size) == \
        (8, [], None, 36, 512)
    assert c.token_budget == 65536


def test_token_budget_defaults_per_device_unless_set():
    assert PdmuxConfig().for_device("sim").split_forward_token_budget == 65536  # SGLang's, on GPUs
    assert PdmuxConfig().for_device("cuda").split_forward_token_budget == 65536
    cpu = PdmuxConfig().for_device("cpu")
    assert cpu.split_forward_token_budget == cpu.token_budget == 4096
    assert PdmuxConfig(split_forward_token_budget=65536).for_device("cpu").split_forward_token_budget == 65536
    with pytest.raises(ConfigError) as err:
        PdmuxConfig().replace(split_forward_token_budget=None)  # unset only by leaving it out
    assert err.value.field == "split_forward_token_budget"


def test_good_sglang_yaml(tmp_path):
    path = write(tmp_path, """
sm_group_num: 5
manual_divisions:
  - [112, 20, 1]
  - [96, 36, 16]
  - [72, 56, 32]
split_forward_token_budget: 32768
decode_bs_divisor: 24
""")
    c = load_pdmux_config(path)
    assert c.sm_group_num == 5
    assert c.manual_divisions == [[112, 20, 1], [96, 36, 16], [72, 56, 32]]
    assert c.split_forward_token_budget == 32768 and c.decode_bs_divisor == 24 and c.chunk_size == 512
    assert c.to_dict() == {"sm_group_num": 5, "manual_divisions": [[112, 20, 1], [96, 36, 16], [72, 56, 32]],
                           "split_forward_token_budget": 32768, "max_split_forward_layers": 0,
                           "decode_bs_divisor": 24, "overlap_decode_full_sm": False, "chunk_size": 512,
                           "level_rule": "sglang", "slo_itl_ms": None, "chunked_prefill_size": 0}
    assert PdmuxConfig(**c.to_dict()) == c


def test_partial_and_empty_files_take_defaults(tmp_path):
    """A file of pdtop's own keys only (or an empty one) is pdtop's configuration, not SGLang's."""
    assert load_pdmux_config(write(tmp_path, "chunk_size: 256\n")) == PdmuxConfig(chunk_size=256)
    assert load_pdmux_config(write(tmp_path, "", "empty.yaml")) == PdmuxConfig()
    assert load_pdmux_config(write(tmp_path, "sm_group_num: 6\n", "p.yaml")) == PdmuxConfig(sm_group_num=6)
    assert load_pdmux_config(write(tmp_path, "sm_group_num: 8\nmanual_divisions: null\n",
                                   "null.yaml")).manual_divisions == []


@pytest.mark.parametrize("text", ["manual_divisions: [[80, 52, 1], [64, 68, 20]]\n", "decode_bs_divisor: 24\n",
                                  "split_forward_token_budget: 8192\nchunk_size: 256\n"])
def test_an_sglang_file_without_sm_group_num_is_refused_as_the_release_refuses_it(tmp_path, text):
    """SGLang 0.5.23's load_pdmux_config: "Missing required field: sm_group_num" (pdtop inferred it before)."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(path)
    assert err.value.field == "sm_group_num" and "0.5.23" in str(err.value) and path in str(err.value)


def test_division_count_must_match_sm_group_num(tmp_path):
    path = write(tmp_path, "sm_group_num: 8\nmanual_divisions: [[80, 52, 1]]\n")
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(path)
    assert err.value.field == "manual_divisions" and path in str(err.value) and "0.5.23" in str(err.value)


def test_an_unknown_key_is_ignored_with_a_warning_naming_it(tmp_path):
    """SGLang 0.5.23 reads its keys with raw.get and skips the rest; a typo is still worth a line."""
    path = write(tmp_path, "sm_group_num: 8\ndecode_bs_divizor: 24\n")
    said: list[str] = []
    assert load_pdmux_config(path, said.append) == PdmuxConfig()
    assert len(said) == 1 and "decode_bs_divizor" in said[0] and "ignored" in said[0] and path in said[0]
    assert "0.5.23" in said[0] and "\n" not in said[0]


@pytest.mark.parametrize("text,field", [
    ("sm_group_num: eight\n", "sm_group_num"),
    ("sm_group_num: true\n", "sm_group_num"),
    ("sm_group_num: 3\ndecode_bs_divisor: 2.5\n", "decode_bs_divisor"),
    ("sm_group_num: 3\nsplit_forward_token_budget: [1]\n", "split_forward_token_budget"),
    ("sm_group_num: 3\nmanual_divisions: 5\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[80, 52]]\n", "manual_divisions"),
    ("sm_group_num: 3\nmanual_divisions: [[80, 52, yes]]\n", "manual_divisions"),
])
def test_bad_type(tmp_path, text, field):
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(write(tmp_path, text))
    assert err.value.field == field and field in str(err.value) and "0.5.23" in str(err.value)


@pytest.mark.parametrize("text,field", [
    ("sm_group_num: 2\n", "sm_group_num"),
    ("sm_group_num: 3\ndecode_bs_divisor: 0\n", "decode_bs_divisor"),
    ("chunk_size: 0\n", "chunk_size"),
    ("sm_group_num: 3\nmanual_divisions: [[80, -52, 1]]\n", "manual_divisions"),
])
def test_out_of_range(tmp_path, text, field):
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(write(tmp_path, text))
    assert err.value.field == field


@pytest.mark.parametrize("text,budget", [("sm_group_num: 3\nsplit_forward_token_budget: 0\n", 0),
                                         ("sm_group_num: 3\nsplit_forward_token_budget: -5\n", -5)])
def test_a_budget_of_zero_or_less_is_one_layer_a_slice_as_in_the_release(tmp_path, text, budget):
    """SGLang 0.5.23: forward_count = max(1, budget // extend_num_tokens): legal, one layer a slice, read
    as the budget 1 that means the same (a live change of the budget must be at least 1)."""
    from pdtop.engine.scheduling.splits import prefill_layers_per_step

    warned: list[str] = []
    config = load_pdmux_config(write(tmp_path, text), warn=warned.append)
    assert config.split_forward_token_budget == 1
    assert len(warned) == 1 and f"{budget} is read as 1" in warned[0]
    assert prefill_layers_per_step(8192, 36, config.token_budget) == 1


def test_unreadable_file(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as err:
        load_pdmux_config(missing)
    assert missing in str(err.value) and err.value.path == missing
    with pytest.raises(ConfigError, match="cannot read"):
        load_pdmux_config(str(tmp_path))  # a directory


def test_bad_yaml_and_not_a_mapping(tmp_path):
    bad = write(tmp_path, "sm_group_num: [8\n", "bad.yaml")
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_pdmux_config(bad)
    assert bad in str(err.value)
    listing = write(tmp_path, "- 8\n- 36\n", "list.yaml")
    with pytest.raises(ConfigError, match="mapping") as err:
        load_pdmux_config(listing)
    assert listing in str(err.value)


def test_validate_normalizes_and_rejects():
    assert validate("manual_divisions", ((80, 52, 1), (72, 60, 9))) == [[80, 52, 1], [72, 60, 9]]
    assert validate("manual_divisions", None) == []
    assert validate("decode_bs_divisor", 24) == 24
    with pytest.raises(ConfigError) as err:
        validate("decode_bs_divisor", False)
    assert err.value.field == "decode_bs_divisor" and "integer" in err.value.reason
    with pytest.raises(ConfigError) as err:
        validate("policy", "pdmux")
    assert err.value.field == "policy"


def test_replace_validates_and_keeps_the_original():
    base = PdmuxConfig()
    new = base.replace(decode_bs_divisor=24, chunk_size=128)
    assert (new.decode_bs_divisor, new.chunk_size) == (24, 128)
    assert (base.decode_bs_divisor, base.chunk_size) == (36, 512)
    with pytest.raises(ConfigError) as err:
        base.replace(decode_bs_divisor=24, sm_group_num=1)
    assert err.value.field == "sm_group_num"
    with pytest.raises(ConfigError) as err:
        base.replace(decode_bs_divsor=24)
    assert err.value.field == "decode_bs_divsor"


def test_constructor_validates():
    with pytest.raises(ConfigError):
        PdmuxConfig(sm_group_num=2)
    with pytest.raises(ConfigError):
        PdmuxConfig(manual_divisions=[[1, 2]])
