"""The roofline terms (`roofline/cost.py`) against the seed's constants, and the GPU specs."""
import pytest

from pdtop.engine.errors import DeviceError
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.roofline.cost import (
    chunk_step_time,
    decode_bytes,
    decode_flops,
    decode_time,
    prefill_bytes,
    prefill_flops,
    prefill_head_flops,
    prefill_layer_flops,
    prefill_time,
)
from pdtop.engine.roofline.gpu_specs import SPECS, parse_gpu

QWEN = synthetic_config("qwen3-8b")
H100 = SPECS["H100"]

# The seed's constants.
SEED_LINEAR = 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 4096 * 151936
SEED_KV_PER_TOKEN = 36 * 2 * 1024 * 2


def test_seed_model_terms():
    assert QWEN.linear_params == SEED_LINEAR
    assert QWEN.kv_bytes_per_token(2) == SEED_KV_PER_TOKEN
    assert decode_bytes(QWEN, [2048] * 32) == 2 * SEED_LINEAR + 32 * 2048 * SEED_KV_PER_TOKEN


@pytest.mark.parametrize("name", ["qwen3-8b", "llama3.1-8b", "smollm2-135m"])
@pytest.mark.parametrize("tokens,start", [(1, 0), (512, 0), (2048, 6144), (8191, 3)])
def test_layers_and_head_add_up_to_prefill_flops(name, tokens, start):
    cfg = synthetic_config(name)
    whole = prefill_flops(cfg, tokens, start)
    by_layer = sum(prefill_layer_flops(cfg, tokens, start, 1) for _ in range(cfg.num_layers))
    assert by_layer + prefill_head_flops(cfg, tokens) == whole
    assert prefill_layer_flops(cfg, tokens, start, cfg.num_layers) + prefill_head_flops(cfg, tokens) == whole


def test_prefill_flops_attention_grows_with_start():
    assert prefill_flops(QWEN, 512, 4096) > prefill_flops(QWEN, 512, 0)
    assert prefill_flops(QWEN, 512, 0) - 2 * SEED_LINEAR * 512 == 2 * 2 * 36 * 4096 * 512 * 512 / 2


def test_decode_and_prefill_bytes_and_flops():
    assert decode_flops(QWEN, [0, 0]) == 2 * 2 * SEED_LINEAR
    assert decode_flops(QWEN, [100]) > decode_flops(QWEN, [10])
    one = prefill_bytes(QWEN, 1000, 1)
    assert prefill_bytes(QWEN, 1000, 36) == pytest.approx(36 * one)
    assert prefill_bytes(QWEN, 1000, 36) + 2 * QWEN.hidden * QWEN.vocab == prefill_bytes(QWEN, 1000, 36, head=True)
    assert prefill_bytes(QWEN, 0, 36) == 2 * 36 * QWEN.linear_params_per_layer


def test_times_scale_with_sms():
    nbytes = decode_bytes(QWEN, [2048] * 32)
    assert decode_time(H100, nbytes, 132) == decode_time(H100, nbytes, 66)  # saturated
    assert decode_time(H100, nbytes, 33) == pytest.approx(2 * decode_time(H100, nbytes, 66))
    flops = prefill_flops(QWEN, 8192)
    assert prefill_time(H100, flops, 66) == pytest.approx(2 * prefill_time(H100, flops, 132))
    base = decode_time(H100, nbytes, 132)
    assert chunk_step_time(H100, QWEN, 1, 0, 1, base) == base  # never faster than a decode step
    with pytest.raises(ValueError):
        decode_time(H100, nbytes, 0)


def test_parse_gpu():
    assert parse_gpu("h100") is SPECS["H100"] and parse_gpu(" A100 ") is SPECS["A100"]
    assert (SPECS["H20"].sms, SPECS["H20"].cc_major) == (78, 9)
    spec = parse_gpu("custom:sms=132,cc=9.0,bw=3.35e12,flops=989e12,s_sat=44,name=mine")
    assert (spec.name, spec.sms, spec.cc_major, spec.cc_minor, spec.mem_bw, spec.peak_flops, spec.s_sat) == \
        ("mine", 132, 9, 0, 3.35e12, 989e12, 44)
    assert parse_gpu("custom:sms=188,cc=10.0,bw=8e12,flops=2.25e15").cc_major == 10
    with pytest.raises(DeviceError, match="'speed'"):
        parse_gpu("custom:sms=132,cc=9.0,bw=3e12,flops=1e15,speed=2")
    with pytest.raises(DeviceError, match="sms"):
        parse_gpu("custom:sms=many,cc=9.0,bw=3e12,flops=1e15")
    with pytest.raises(DeviceError, match="cc"):
        parse_gpu("custom:sms=132,cc=nine,bw=3e12,flops=1e15")
    with pytest.raises(DeviceError, match="mfu"):
        parse_gpu("custom:sms=132,cc=9.0,bw=3e12,flops=1e15,mfu=1.5")
    with pytest.raises(DeviceError, match="unknown GPU"):
        parse_gpu("TPU")
