"""The cuda device on the stand-in driver (and a stand-in for torch's streams): teardown order (what
was captured on a level's streams, the decode graphs, is freed and the device synchronized before
the streams and green contexts are destroyed, on `set_groups` dropping levels and on `close()`), and
each level's SMs measured on its own streams."""
import itertools
from types import SimpleNamespace

import pytest
from fake_cuda_driver import FakeDriver, FakeNvrtc

from pdtop.engine.devices.cuda import CudaDevice, retire_levels
from pdtop.engine.devices.green_ctx import GreenContexts
from pdtop.engine.errors import DeviceError

_ids = itertools.count(1)


class _Stream:
    """torch.cuda.Stream's part the device uses here (a handle, synchronize, priority)."""

    def __init__(self, device=None, priority=0):
        self.cuda_stream, self.priority = -next(_ids), priority

    def synchronize(self):
        pass


class _External(_Stream):
    def __init__(self, handle, device=None):
        self.cuda_stream, self.priority = handle, 0


def _device(drv: FakeDriver, groups=None) -> CudaDevice:
    torch_streams = SimpleNamespace(cuda=SimpleNamespace(
        Stream=_Stream, ExternalStream=_External, synchronize=lambda device: drv.calls.append("synchronize")))
    dev = CudaDevice.__new__(CudaDevice)
    dev._start(torch_streams, "cuda:0", GreenContexts(driver=drv), groups, 8, False)
    return dev


def _first(calls: list[str], name: str, after: int = 0) -> int:
    return next(i for i, c in enumerate(calls) if c == name and i >= after)


def test_listeners_free_graphs_before_levels_are_destroyed():
    drv = FakeDriver()
    dev = _device(drv)
    told: list[tuple[set[int], int]] = []  # (streams the listener was given, calls made by then)
    dev.add_streams_listener(lambda streams: told.append((set(streams), len(drv.calls))))
    kept = dev._made[(80, 52)].decode.cuda_stream
    dev.set_groups([(132, 0), (80, 52), (0, 132)])
    streams, at = told[-1]
    assert kept in streams and len(streams) == 3  # the kept split level, the whole-device decode and run_whole
    destroyed = _first(drv.calls, "cuStreamDestroy", at)
    assert "cuStreamDestroy" not in drv.calls[:at] and "cuGreenCtxDestroy" not in drv.calls[:at]
    assert "synchronize" in drv.calls[at:destroyed]
    assert len(drv.live_contexts) == 2 and len(drv.live_streams) == 2  # (80, 52) only: outer refused by default

    dev.close()
    streams, at = told[-1]
    assert streams == set()  # close: every graph freed
    assert "synchronize" in drv.calls[at:_first(drv.calls, "cuStreamDestroy", at)]
    assert _first(drv.calls, "cuStreamDestroy", at) < _first(drv.calls, "cuGreenCtxDestroy", at)
    assert not drv.live_contexts and not drv.live_streams


def test_a_failing_listener_still_lets_the_contexts_go():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pair = gc.split(60, 40)

    def broken(streams):
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        retire_levels(gc, [pair], [broken], {}, lambda: None)
    assert not drv.live_contexts and not drv.live_streams and not gc.pairs


def test_destroy_errors_are_one_line_after_every_pair_was_tried():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pairs = [gc.split(60, 40), gc.split(80, 52)]
    drv.live_streams.discard(pairs[0].prefill_stream)  # the driver no longer knows it: destroying it fails
    with pytest.raises(DeviceError) as err:
        retire_levels(gc, pairs, [], {}, lambda: None)
    assert "\n" not in str(err.value) and not drv.live_contexts


def test_every_level_is_measured_on_its_own_streams():
    drv = FakeDriver()
    dev = _device(drv)
    try:
        got = dev.measure_sms(nvrtc=FakeNvrtc(), clock=drv.clock)
        for (p, d), m in zip(dev.realized, got, strict=True):
            seen = tuple(None if side is None else side["smid_distinct"] for side in (m["prefill"], m["decode"]))
            assert seen == (p or None, d or None)
            assert m["shared_smids"] == (0 if p and d else None)
        carve = dev.describe().extra["levels_carve"][1]
        assert carve == {"outer_sms": None, "note": dev.gc.pairs[0].carve_note, "outer_limits": None}
    finally:
        dev.close()
    assert not drv.memory and not drv.libraries and not drv.live_contexts
