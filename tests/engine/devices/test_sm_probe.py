"""The independent SM measure (`sm_probe`): its counting and estimating, its launch path against the
stand-in driver (buffers, library and stream freed; errors one line), and the kernels through the real
NVRTC where it is installed (no GPU needed to compile)."""
import importlib.util

import pytest
from fake_cuda_driver import FakeDriver, FakeNvrtc

from pdtop.engine.devices import sm_probe
from pdtop.engine.devices.green_ctx import GreenContexts
from pdtop.engine.devices.sm_probe import (
    UNWRITTEN,
    SmProbe,
    compile_cubin,
    distinct_sms,
    measure_levels,
    scaled_iters,
    timed_sms,
)
from pdtop.engine.errors import DeviceError
from pdtop.engine.roofline.partition import stream_groups


def test_distinct_sms_counts_ids_and_refuses_blocks_that_did_not_run():
    assert distinct_sms([3, 1, 3, 0, 1]) == {0, 1, 3}
    with pytest.raises(DeviceError, match=r"^2 of 4 probe blocks recorded no SM id$"):
        distinct_sms([1, UNWRITTEN, 2, UNWRITTEN])


@pytest.mark.parametrize("whole,stream,expected", [(0.004, 0.004, 132.0), (0.004, 0.0066, 80.0), (1.0, 2.0, 66.0)])
def test_timed_sms_scales_the_whole_device_by_the_time_ratio(whole, stream, expected):
    assert timed_sms(132, whole, stream) == expected


def test_timed_sms_refuses_times_that_are_not_positive():
    with pytest.raises(DeviceError, match="must be positive"):
        timed_sms(132, 0.0, 1.0)


def test_scaled_iters_aims_at_the_target_within_bounds():
    assert scaled_iters(2000, 0.001, 0.004) == 8000
    assert scaled_iters(2000, 10.0) == sm_probe.ITERS_MIN and scaled_iters(2000, 0.0) == sm_probe.ITERS_MAX


def _levels(drv: FakeDriver, gc: GreenContexts):
    pairs = [gc.split(p, d) for p, d in stream_groups(132, 9)[1:-1]]
    whole = drv.cuStreamCreate(1)[1]  # stands for the whole-device torch stream of the end levels
    return pairs, [(whole, None), *[(p.prefill_stream, p.decode_stream) for p in pairs], (None, whole)]


@pytest.mark.parametrize("leaky", [False, True])
def test_every_level_measured_on_its_own_streams_and_everything_freed(leaky):
    drv = FakeDriver(leaky=leaky)
    gc = GreenContexts(driver=drv)
    pairs, handles = _levels(drv, gc)
    probe = SmProbe(gc, nvrtc=FakeNvrtc(), clock=drv.clock)
    try:
        got = measure_levels(probe, handles, time_limit_s=60)
    finally:
        probe.close()
    assert got[0] == {"prefill": {"smid_distinct": 132, "timed_sms": 132.0}, "decode": None, "shared_smids": None}
    assert got[-1]["prefill"] is None and got[-1]["decode"]["smid_distinct"] == 132
    for pair, level in zip(pairs, got[1:-1], strict=True):
        seen = (level["prefill"]["smid_distinct"], level["decode"]["smid_distinct"])
        timed = (level["prefill"]["timed_sms"], level["decode"]["timed_sms"])
        if leaky:  # contexts that do not isolate: every side runs on all 132, and both sides share them
            assert seen == (132, 132) and level["shared_smids"] == 132
        else:
            assert seen == pair.realized and level["shared_smids"] == 0
            assert timed == pytest.approx(pair.realized, abs=1.0)  # the fake runs blocks in waves, as a GPU
    assert not drv.memory and not drv.libraries and not drv.ctx_stack
    assert len(drv.live_streams) == 2 * len(pairs) + 1  # the probe's own stream is gone


def test_levels_past_the_time_limit_are_none():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    _, handles = _levels(drv, gc)
    probe = SmProbe(gc, nvrtc=FakeNvrtc(), clock=drv.clock)
    got = measure_levels(probe, handles, time_limit_s=0.0)
    probe.close()
    assert got[0] is not None and got[1:] == [None] * (len(handles) - 1)


def test_a_failed_load_is_one_line_and_leaves_nothing():
    drv = FakeDriver(fail_load=True)
    with pytest.raises(DeviceError, match=r"^cuLibraryLoadData failed: CUDA_ERROR_INVALID_IMAGE \(200\)$"):
        SmProbe(GreenContexts(driver=drv), nvrtc=FakeNvrtc(), clock=drv.clock)
    assert not drv.memory and not drv.libraries and not drv.ctx_stack


def test_a_failed_compile_says_nvrtc_s_first_log_line():
    nvrtc = FakeNvrtc(fail=True)
    with pytest.raises(DeviceError, match=r"^nvrtcCompileProgram failed: .*: probe\.cu\(3\): error: bad asm$"):
        compile_cubin(9, 0, nvrtc)
    assert not nvrtc.live
    assert nvrtc.options == [b"--gpu-architecture=sm_90"]


def _nvrtc():
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return None
    try:
        nvrtc = sm_probe.load_nvrtc()
        nvrtc.nvrtcVersion()  # loads libnvrtc
    except Exception:
        return None
    return nvrtc


@pytest.mark.skipif(_nvrtc() is None, reason="needs cuda.bindings.nvrtc and libnvrtc")
@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_the_kernels_compile_with_nvrtc(cc):
    cubin = compile_cubin(*cc, _nvrtc())
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
