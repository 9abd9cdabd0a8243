"""The cuda device on the stand-in driver (and a stand-in for torch's streams): its levels outlive it (what
was captured on a level's streams, the decode graphs, is freed and the device synchronized before the
levels go back to the process's pool, on `set_groups` dropping levels and on `close()`; no green context
or stream a device ran on is ever destroyed, so a tensor used there may be freed after the device
closed, and the next device takes the same levels), and each level's SMs measured on its own streams."""
from types import SimpleNamespace

import pytest
from fake_cuda_driver import CachedBlock, FakeDriver, FakeNvrtc, fake_cuda_device

from pdtop.engine.devices import green_ctx
from pdtop.engine.devices.cuda import retire_levels
from pdtop.engine.devices.green_ctx import MAX_KEPT_PAIRS, GreenContexts
from pdtop.engine.errors import DeviceError


def _first(calls: list[str], name: str, after: int = 0) -> int:
    return next(i for i, c in enumerate(calls) if c == name and i >= after)


def test_listeners_free_graphs_before_levels_go_back():
    drv = FakeDriver()
    dev = fake_cuda_device(drv)
    told: list[tuple[set[int], int]] = []  # (streams the listener was given, calls made by then)
    dev.add_streams_listener(lambda streams: told.append((set(streams), len(drv.calls))))
    kept = dev._made[(80, 52)].decode.cuda_stream
    made = len(drv.live_contexts)
    dev.set_groups([(132, 0), (80, 52), (0, 132)])
    streams, at = told[-1]
    assert kept in streams and len(streams) == 3  # the kept split level, the whole-device decode and run_whole
    assert "synchronize" in drv.calls[at:]
    assert len(dev.gc._free) == len(dev.gc.pairs) - 1  # every level dropped is back in the pool, alive
    dev.close()
    streams, at = told[-1]
    assert streams == set() and "synchronize" in drv.calls[at:]  # close: every graph freed, then synchronized
    assert "cuStreamDestroy" not in drv.calls and "cuGreenCtxDestroy" not in drv.calls
    assert len(drv.live_contexts) == made and not drv.dead_streams


def test_tensors_used_on_a_level_may_be_freed_after_the_device_closed():
    """The first H100 run's abort: a decoder's pinned staging buffers (copied with non_blocking on each
    level's decode stream) were freed after `close()` had destroyed those streams, and torch's allocator
    recorded an event on them in the tensor's destructor. Freed after the levels were dropped or the
    device closed, each block here records its events on streams that are still alive."""
    drv = FakeDriver()
    dev = fake_cuda_device(drv)
    pinned, activations = CachedBlock(drv), CachedBlock(drv)
    for level in range(len(dev.groups)):
        dev.set_level(level)
        prefill, decode = dev.side_streams()
        pinned.use_on(decode)
        activations.use_on(prefill)
    assert len(pinned.streams) == len(dev.groups) - 1  # the two end levels share the whole-device stream
    used = len(pinned.streams) + len(activations.streams)
    dev.set_groups([(132, 0), (80, 52), (0, 132)])  # levels dropped while the prefill's tensors live
    activations.free()
    dev.close()
    pinned.free()
    assert drv.calls.count("cuEventRecord") == used


def test_the_stand_in_aborts_as_the_gpu_did_on_a_destroyed_stream():
    """What the test above guards against, shown on the stand-in: a block used on a stream that is then
    destroyed cannot be freed (on a GPU: terminate). Only a pair no device was given may be destroyed."""
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pair = gc.split(60, 40)
    block = CachedBlock(drv)
    block.use_on(SimpleNamespace(cuda_stream=pair.decode_stream))
    gc.destroy(pair)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_CONTEXT_IS_DESTROYED"):
        block.free()


def test_the_next_device_takes_the_same_levels_and_two_devices_never_share_one():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    first = fake_cuda_device(drv, gc=gc)
    streams = {g: (lvl.prefill.cuda_stream, lvl.decode.cuda_stream) for g, lvl in first._made.items() if lvl.pair}
    second = fake_cuda_device(drv, gc=gc)  # both open: its own levels
    theirs = {g: (lvl.prefill.cuda_stream, lvl.decode.cuda_stream) for g, lvl in second._made.items() if lvl.pair}
    assert theirs.keys() == streams.keys() and not {s for v in theirs.values() for s in v} & {
        s for v in streams.values() for s in v}
    first.close()
    second.close()
    created = drv.calls.count("cuGreenCtxCreate")
    third = fake_cuda_device(drv, gc=gc)
    again = {g: (lvl.prefill.cuda_stream, lvl.decode.cuda_stream) for g, lvl in third._made.items() if lvl.pair}
    assert drv.calls.count("cuGreenCtxCreate") == created  # no green context made: the pool's
    assert set(again.values()) <= set(streams.values()) | set(theirs.values())
    third.close()
    assert gc.kept == 2 * len(streams) and gc.describe()["levels_kept"] == gc.kept


def test_kept_levels_are_never_destroyed_and_their_number_is_bounded():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pair = gc.acquire(80, 52)
    with pytest.raises(ValueError, match="kept for the process's life"):
        gc.destroy(pair)
    gc.release(pair)
    gc.release(pair)  # twice: still one entry
    assert gc.acquire(80, 52) is pair and gc.acquire(80, 52) is not pair
    gc.close()  # a closed GreenContexts leaves kept pairs (and the primary context) alive
    assert len(drv.live_contexts) == 4 and "cuDevicePrimaryCtxRelease" not in drv.calls
    with pytest.raises(DeviceError, match="closed"):
        gc.acquire(80, 52)
    many = GreenContexts(driver=FakeDriver(sms=100_000))
    for i in range(MAX_KEPT_PAIRS):
        many.acquire(8, 8 + 8 * i)
    with pytest.raises(DeviceError, match=f"already keeps {MAX_KEPT_PAIRS} green-context levels") as err:
        many.acquire(16, 8)
    assert "\n" not in str(err.value)


def test_a_refused_table_changes_nothing_and_its_new_level_goes_back():
    drv = FakeDriver()
    dev = fake_cuda_device(drv)
    before = (list(dev.groups), dict(dev._made))
    drv.fail_create = {96}  # (56, 40)'s first carve: refused; (60, 40) is made, then not enough levels
    with pytest.raises(DeviceError, match="no usable split table"):
        dev.set_groups([(60, 40), (56, 40)])
    assert (dev.groups, dev._made) == before
    assert [p.requested for p in dev.gc._free[(60, 40, False)]] == [(60, 40)]  # back in the pool, alive
    dev.close()


def test_a_failing_listener_still_gives_the_levels_back():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pair = gc.acquire(60, 40)

    def broken(streams):
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        retire_levels(gc, [pair], [broken], {}, lambda: None)
    assert gc.acquire(60, 40) is pair and len(drv.live_streams) == 2


def test_the_process_has_one_green_contexts_per_gpu(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(green_ctx, "_shared", {})
    monkeypatch.setattr(green_ctx, "load_driver", lambda: drv)
    assert green_ctx.shared(0) is green_ctx.shared(0)
    assert drv.calls.count("cuDevicePrimaryCtxRetain") == 1


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
    assert not drv.memory and not drv.libraries and len(drv.live_contexts) == 2 * dev.gc.kept  # kept: alive


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
