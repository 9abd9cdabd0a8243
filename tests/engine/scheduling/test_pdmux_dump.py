"""dump_pdmux_config writes SGLang's --pdmux-config-path YAML: SGLang's keys and shapes, read back equal."""
from __future__ import annotations

import pytest
import yaml

from pdtop.engine.errors import ConfigError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, dump_pdmux_config, load_pdmux_config

# SGLang's PDMuxConfig fields, in its order (python/sglang/srt/multiplex/pdmux_context.py): the release
# 0.5.23 has four; sgl-project/sglang at 337ee8ed adds the two newer keys
RELEASE_FIELDS = ("sm_group_num", "manual_divisions", "split_forward_token_budget", "decode_bs_divisor")
SGLANG_FIELDS = ("sm_group_num", "manual_divisions", "split_forward_token_budget", "max_split_forward_layers",
                 "decode_bs_divisor", "overlap_decode_full_sm")


def sglang_load(path, release: bool = False) -> dict:
    """SGLang's load_pdmux_config, rule for rule: the file read with yaml.safe_load, sm_group_num
    required and >= 3, sm_group_num - 2 divisions when there are any, the other keys defaulted
    (the release reads four keys; newer SGLang checks its two more)."""
    with open(path) as f:
        raw = yaml.safe_load(f)
    if "sm_group_num" not in raw:
        raise ValueError("Missing required field: sm_group_num")
    if raw["sm_group_num"] < 3:
        raise ValueError("sm_group_num must be >= 3")
    divisions = raw.get("manual_divisions", [])
    if divisions and len(divisions) != raw["sm_group_num"] - 2:
        raise ValueError("manual_divisions count")
    out = {"sm_group_num": raw["sm_group_num"], "manual_divisions": divisions,
           "split_forward_token_budget": raw.get("split_forward_token_budget", 65536),
           "decode_bs_divisor": raw.get("decode_bs_divisor", 36)}
    if release:
        return out
    overlap = raw.get("overlap_decode_full_sm", False)
    if overlap and not divisions:
        raise ValueError("overlap_decode_full_sm requires manual_divisions")
    cap = raw.get("max_split_forward_layers", 0)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        raise ValueError("max_split_forward_layers must be a non-negative integer")
    return out | {"max_split_forward_layers": cap, "overlap_decode_full_sm": overlap}


def sglang_stream_idx(config: dict, decode_bs: int) -> int:
    """SGLang's adjust_stream_groups (multiplexing_mixin.py) while a split prefill runs: with manual
    divisions the last whose threshold decode_bs reaches (none reached is an UnboundLocalError
    there), else decode_bs scaled by the divisor into 1 .. sm_group_num - 2."""
    divisions = config["manual_divisions"]
    if divisions:
        reached = [i + 1 for i, (_, _, threshold) in enumerate(divisions) if decode_bs >= threshold]
        if not reached:
            raise UnboundLocalError("stream_idx")
        return reached[-1]
    groups = config["sm_group_num"]
    return max(1, min(groups - 2, decode_bs * (groups - 2) // config["decode_bs_divisor"]))


RELEASE_CONFIGS = [
    PdmuxConfig(split_forward_token_budget=65536),
    PdmuxConfig(sm_group_num=3, split_forward_token_budget=147456, decode_bs_divisor=24),
    PdmuxConfig(sm_group_num=5, manual_divisions=[[112, 20, 1], [96, 36, 16], [72, 56, 32]],
                split_forward_token_budget=8192),
    PdmuxConfig(sm_group_num=3, manual_divisions=[[72, 60, 1]], split_forward_token_budget=294912),
]
NEWER_CONFIG = PdmuxConfig(sm_group_num=4, manual_divisions=[[104, 0, 1], [80, 0, 16]], split_forward_token_budget=8192,
                           max_split_forward_layers=2, overlap_decode_full_sm=True)


@pytest.mark.parametrize("config,sglang", [*((c, "0.5.23") for c in RELEASE_CONFIGS),
                                           *((c, "main") for c in [*RELEASE_CONFIGS, NEWER_CONFIG])])
def test_round_trip_with_sglang_keys_and_shapes(tmp_path, config, sglang):
    text = dump_pdmux_config(config, "pdtop tune on sim:H100\nsecond line", sglang)
    raw = yaml.safe_load(text)
    fields = RELEASE_FIELDS if sglang == "0.5.23" else SGLANG_FIELDS
    assert tuple(raw) == fields  # exactly that SGLang's keys, in its order
    assert all(type(raw[k]) is int for k in fields if k not in ("manual_divisions", "overlap_decode_full_sm"))
    assert sglang == "0.5.23" or type(raw["overlap_decode_full_sm"]) is bool
    divisions = raw["manual_divisions"]
    assert isinstance(divisions, list)
    assert all(isinstance(d, list) and len(d) == 3 and all(type(x) is int for x in d) for d in divisions)
    path = tmp_path / "best.yaml"
    path.write_text(text)
    read = sglang_load(path, release=sglang == "0.5.23")
    assert read == {k: v for k, v in config.to_dict().items() if k in fields}
    assert all(1 <= sglang_stream_idx(read, bs) <= read["sm_group_num"] - 2 for bs in range(1, 512))
    assert load_pdmux_config(str(path)) == config
    assert text.startswith("# pdtop tune on sim:H100\n# second line\n")


def test_the_release_is_the_default_and_newer_keys_are_not_written_for_it():
    """Issue 40: a file with the newer keys ran under the release's reading as something else (48.5 ms
    ITL p99 against 9.5 measured): pdtop writes for the release unless asked, and never a key it skips."""
    assert tuple(yaml.safe_load(dump_pdmux_config(PdmuxConfig()))) == RELEASE_FIELDS
    for config in (NEWER_CONFIG, PdmuxConfig(max_split_forward_layers=2)):
        with pytest.raises(ConfigError) as err:
            dump_pdmux_config(config)
        assert "0.5.23" in str(err.value) and err.value.field in ("max_split_forward_layers", "overlap_decode_full_sm")
    with pytest.raises(ConfigError):
        dump_pdmux_config(PdmuxConfig(), sglang="0.4.0")


def test_divisions_set_the_group_count_sglang_requires(tmp_path):
    """pdtop ignores sm_group_num beside manual divisions; SGLang requires it to be their count + 2."""
    config = PdmuxConfig(sm_group_num=8, manual_divisions=[[80, 52, 1], [64, 68, 20]])
    path = tmp_path / "d.yaml"
    path.write_text(dump_pdmux_config(config))
    sglang = sglang_load(path)
    assert sglang["sm_group_num"] == 4 and sglang["manual_divisions"] == [[80, 52, 1], [64, 68, 20]]
    assert [sglang_stream_idx(sglang, bs) for bs in (1, 19, 20, 64)] == [1, 1, 2, 2]


def test_an_unset_budget_is_written_as_the_one_sglang_would_use(tmp_path):
    """pdtop leaves the budget to the device (4,096 on the CPU); SGLang's file gets SGLang's default."""
    path = tmp_path / "u.yaml"
    path.write_text(dump_pdmux_config(PdmuxConfig()))
    assert sglang_load(path)["split_forward_token_budget"] == 65536
    assert load_pdmux_config(str(path)) == PdmuxConfig().for_device("cuda")


def test_pdtop_only_chunk_size_is_written_when_not_the_default(tmp_path):
    config = PdmuxConfig(split_forward_token_budget=65536, chunk_size=256)
    text = dump_pdmux_config(config)
    assert tuple(yaml.safe_load(text)) == (*RELEASE_FIELDS, "chunk_size")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_pdmux_config(str(path)) == config
