"""KV-cache arithmetic (`roofline/kv.py`) against the seed's example, and the links that carry it."""
import pytest

from pdtop.engine.errors import FieldError
from pdtop.engine.model.config import SYNTHETIC
from pdtop.engine.roofline.kv import (
    LINKS,
    Link,
    kv_bytes,
    kv_bytes_per_token,
    parse_dtype_bytes,
    parse_link,
    requests_fit,
    transfer_time,
)

GIB = 1024**3


def test_the_seeds_qwen25_32b_example():
    # 64 layers, 8 KV heads (GQA), head_dim 128, BF16
    assert kv_bytes_per_token(64, 8, 128) == 2 * 64 * 8 * 128 * 2 == 262_144
    assert kv_bytes_per_token(64, 8, 128) / 1024 == 256.0
    assert kv_bytes(64, 8, 128, 8192, 1) == 2 * GIB
    assert kv_bytes(64, 8, 128, 32768, 1) == 8 * GIB
    # ordinary MHA: 40 KV heads, 5x as much
    assert kv_bytes_per_token(64, 40, 128) == 5 * 262_144 == 1.25 * 1024**2
    assert kv_bytes(64, 40, 128, 8192) == 10 * GIB


def test_kv_bytes_is_the_seeds_formula():
    for layers, heads, dim, seq, batch, dt in [(1, 1, 1, 1, 1, 1), (36, 8, 128, 2048, 32, 2), (30, 3, 64, 7, 3, 4)]:
        assert kv_bytes(layers, heads, dim, seq, batch, dt) == 2 * layers * heads * dim * seq * batch * dt
    assert kv_bytes(64, 8, 128, 0) == 0 and kv_bytes(64, 8, 128, 8192, 0) == 0


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_agrees_with_the_model_config(name):
    cfg = SYNTHETIC[name]
    for dt in (1, 2, 4):
        assert kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dt) == cfg.kv_bytes_per_token(dt)


def test_requests_fit():
    assert requests_fit(80 * GIB, 2 * GIB) == 40
    assert requests_fit(80 * GIB, 8 * GIB) == 10
    assert requests_fit(80 * GIB, 10 * GIB + 1) == 7
    assert requests_fit(GIB, 2 * GIB) == 0 and requests_fit(0, 1) == 0


@pytest.mark.parametrize("call", [
    lambda: kv_bytes_per_token(0, 8, 128), lambda: kv_bytes_per_token(64, -8, 128),
    lambda: kv_bytes_per_token(64, 8, 12.5), lambda: kv_bytes_per_token(64, 8, 128, 0),
    lambda: kv_bytes_per_token(True, 8, 128), lambda: kv_bytes(64, 8, 128, -1),
    lambda: requests_fit(GIB, 0), lambda: requests_fit(-1, 1),
])
def test_bad_shapes_are_value_errors(call):
    with pytest.raises(ValueError):
        call()


def test_parse_dtype_bytes():
    assert parse_dtype_bytes("bfloat16") == 2 and parse_dtype_bytes(" Float32 ") == 4
    assert parse_dtype_bytes("2") == 2 and parse_dtype_bytes("1") == 1
    # vLLM's and SGLang's --kv-cache-dtype names (issue 42 item 19: fp8 and float16 were refused)
    names = ("fp8", "FP8_E4M3", "fp8_e5m2", "float16", "fp16", "bf16")
    assert [parse_dtype_bytes(n) for n in names] == [1, 1, 1, 2, 2, 2]
    for bad in ("fp4", "int8", "1.5", "0", "-2", ""):
        with pytest.raises(FieldError, match="--dtype"):
            parse_dtype_bytes(bad, "--dtype")


def test_parse_link():
    assert parse_link("rdma400") == Link("rdma400", 50e9)
    assert parse_link(" NVLink ") == Link("nvlink", 450e9)
    assert {k: parse_link(k).gb_s for k in LINKS} == {
        "nvlink": 450, "rdma400": 50, "rdma200": 25, "rdma100": 12.5, "pcie5": 64}
    assert parse_link("37.5") == Link("37.5 GB/s", 37.5e9)
    assert parse_link("none") is None and parse_link("None") is None
    for bad in ("infiniband", "0", "-5", "nan", "inf", ""):
        with pytest.raises(FieldError, match="--link"):
            parse_link(bad, "--link")


def test_transfer_time():
    kv = kv_bytes(36, 8, 128, 8192)  # Qwen3-8B, an 8192-token prompt: 1.2 GB
    assert transfer_time(kv, Link("rdma400", 50e9)) == pytest.approx(kv / 50e9)
    assert transfer_time(kv, parse_link("rdma100")) == pytest.approx(4 * transfer_time(kv, parse_link("rdma400")))
    assert transfer_time(1e9, parse_link("nvlink")) == pytest.approx(1 / 450)
