"""The cuda device on the stand-in driver (and a stand-in for torch's streams): teardown order (what
was captured on a level's streams, the decode graphs, is freed and the device synchronized before
the streams and green contexts are destroyed, on `set_groups` dropping levels and on `close()`), and
each level's SMs measured on its own streams."""
import pytest
from fake_cuda_driver import FakeDriver, FakeNvrtc, fake_cuda_device

from pdtop.engine.devices.cuda import retire_levels
from pdtop.engine.devices.green_ctx import GreenContexts
from pdtop.engine.errors import DeviceError


def _first(calls: list[str], name: str, after: int = 0) -> int:
    return next(i for i, c in enumerate(calls) if c == name and i >= after)


def test_listeners_free_graphs_before_levels_are_destroyed():
    drv = FakeDriver()
    dev = fake_cuda_device(drv)
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
    dev = fake_cuda_device(drv)
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


def test_a_refused_level_is_described_beside_the_table_as_requested():
    """The driver refuses one level's decode context: the device runs the others, and says which level of
    the table it dropped and the driver's reason (bench/gpu_check.py records both for its verdict)."""
    from pdtop.engine.roofline.partition import stream_groups

    drv = FakeDriver(fail_create={52})  # (80, 52)'s decode side
    dev = fake_cuda_device(drv)
    try:
        table = stream_groups(132, 9)
        info = dev.describe().extra
        assert info["levels_requested"] == [list(g) for g in table] and dev.wanted == table
        dropped = info["dropped_levels"]
        assert [(x["level"], x["requested"]) for x in dropped] == [(table.index((80, 52)), [80, 52])]
        assert dropped[0]["reason"].startswith("cuGreenCtxCreate failed: CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION")
        assert dev.groups == [g for g in table if g != (80, 52)] and info["levels_realized"] == [
            list(g) for g in dev.groups]
    finally:
        dev.close()
