"""Carving split levels as SGLang does (p + d, then p), against a stand-in driver with real rounding rules."""
import logging

import pytest
from fake_cuda_driver import FakeDriver

from pdtop.engine.devices.cuda import make_levels
from pdtop.engine.devices.green_ctx import GreenContexts
from pdtop.engine.devices.sm_split import PartitionLimits, plan_split
from pdtop.engine.errors import DeviceError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable, stream_groups

HOPPER = PartitionLimits(8, 8, "driver")


@pytest.mark.parametrize("p,d,total,limits,expected", [
    (60, 40, 132, HOPPER, (64, 40)),  # the example: recorded 60/40, ran 64/68 before
    (80, 52, 132, HOPPER, (80, 52)),  # p + d rounds past the device: its whole 132
    (60, 44, 132, HOPPER, (64, 40)),  # 104 carved, prefill takes 64: decode gets less than asked
    (64, 4, 132, HOPPER, (64, 8)),
    (60, 4, 132, HOPPER, None),  # 64 carved, all of it prefill's
    (130, 2, 132, HOPPER, None),
    (13, 40, 108, PartitionLimits.from_table(8), (14, 40)),  # A100: parts of 2, at least 4
    (60, 40, 132, PartitionLimits(16, 16, "driver"), (64, 48)),
    (0, 40, 132, HOPPER, None),
    (100, 40, 132, HOPPER, None),
])
def test_plan_split(p, d, total, limits, expected):
    assert plan_split(p, d, total, limits) == expected


@pytest.mark.parametrize("p,d,expected", [
    (104, 132, (104, 132)),  # SGLang's test: a (104, 28) pair for prefill, the whole device for decode
    (100, 132, (104, 132)),  # prefill's part rounds up as in any split
    (132, 132, None),  # a whole-device cap leaves the pair no decode half
    (104, 100, None),  # overlapped, but decode not the whole device: not a level SGLang makes
    (132, 0, (132, 0)), (0, 132, (0, 132)), (80, 52, (80, 52)),
])
def test_plan_level_with_overlapped_levels(p, d, expected):
    from pdtop.engine.devices.sm_split import plan_level

    assert plan_level(p, d, 132, HOPPER) == expected


def test_limits_come_from_the_driver_where_cuda13_reports_them():
    assert GreenContexts(driver=FakeDriver(min_part=16, align=16)).limits == PartitionLimits(16, 16, "driver")
    assert GreenContexts(driver=FakeDriver(cuda13=False)).limits == PartitionLimits(8, 8, "table")
    assert GreenContexts(driver=FakeDriver(cuda13=False, cc=(8, 0), sms=108)).limits == PartitionLimits(4, 2, "table")


def test_manual_division_is_carved_then_split_and_read_back():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    pair = gc.split(60, 40)
    assert pair.requested == (60, 40) and pair.realized == (64, 40)
    assert drv.calls.count("cuDevSmResourceSplitByCount") == 2  # p + d first, then p
    assert sorted(r.sm.smCount for r in drv.live_contexts.values()) == [40, 64, 104]  # outer context kept alive
    assert len(drv.live_streams) == 2 and {pair.prefill_stream, pair.decode_stream} == drv.live_streams
    gc.destroy(pair)
    assert not drv.live_contexts and not drv.live_streams


@pytest.mark.parametrize("oversize,outer", [("none", None), ("error", None), ("all", 132)])
def test_whole_device_levels_are_carved_first_as_sglang_does(oversize, outer, caplog):
    """SGLang carves p + d first even when that is the whole device; where the driver will not
    (132 rounds past 132 SMs in steps of 8), the device's own SMs are split and the pair says so."""
    drv = FakeDriver(oversize=oversize)
    gc = GreenContexts(driver=drv)
    groups = stream_groups(132, 9)[1:-1]
    with caplog.at_level(logging.INFO, logger="pdtop.engine.devices.green_ctx"):
        pairs = [gc.split(p, d) for p, d in groups]
    assert [pair.realized for pair in pairs] == groups  # realized equals requested for every automatic level
    assert drv.calls.count("cuDevSmResourceSplitByCount") == 2 * len(groups) - (oversize == "error") * len(groups)
    assert all(pair.outer_sms == outer for pair in pairs)
    assert all((pair.carve_note is None) == (outer is not None) for pair in pairs)
    assert len(caplog.records) == (0 if outer else len(groups))
    assert len(drv.live_contexts) == len(groups) * (3 if outer else 2)
    gc.close()
    assert not drv.live_contexts and not drv.live_streams


def test_a_level_short_of_the_device_is_never_split_from_the_device():
    drv = FakeDriver(oversize="error")
    gc = GreenContexts(driver=drv)
    pair = gc.split(60, 40)
    assert pair.outer_sms == 104 and pair.carve_note is None and pair.realized == (64, 40)
    drv.fail_create = {96}  # the first carve's context: the level fails, nothing is split from the device
    with pytest.raises(DeviceError, match=r"^cuGreenCtxCreate failed"):
        gc.split(56, 40)
    assert len(drv.live_contexts) == 3 and drv.calls.count("cuDevSmResourceSplitByCount") == 3


def test_the_second_split_follows_the_carved_context_s_own_limits():
    gc = GreenContexts(driver=FakeDriver(ctx_align=2))
    pair = gc.split(60, 40)
    assert pair.outer_limits == PartitionLimits(8, 2, "driver") and pair.realized == (60, 44)
    assert plan_split(60, 40, 132, gc.limits, inner=pair.outer_limits) == pair.realized
    assert plan_split(60, 40, 132, gc.limits) == (64, 40)  # the device's limits alone predict otherwise


def test_driver_limits_change_what_is_realized():
    gc = GreenContexts(driver=FakeDriver(min_part=16, align=16))
    assert gc.split(60, 40).realized == (64, 48)


def test_unrealizable_level_is_refused_without_leaks():
    drv = FakeDriver()
    gc = GreenContexts(driver=drv)
    with pytest.raises(DeviceError, match=r"cannot carve it: prefill's 60 SMs round up to 64 of the 64 carved"):
        gc.split(60, 4)
    drv.fail_create = {40}
    with pytest.raises(DeviceError, match=r"^cuGreenCtxCreate failed"):
        gc.split(60, 40)
    assert not drv.live_contexts and not drv.live_streams


def test_a_bad_level_is_dropped_with_one_warning_line_and_the_rest_kept(caplog):
    gc = GreenContexts(driver=FakeDriver())
    wanted = [(132, 0), (80, 52), (60, 4), (60, 40), (0, 132)]

    def make(g):
        p, d = g
        return (p, d) if not (p and d) else gc.split(p, d).realized

    with caplog.at_level(logging.WARNING):
        made, dropped = make_levels(wanted, make, {})
    assert [made.get(g) for g in wanted] == [(132, 0), (80, 52), None, (64, 40), (0, 132)]
    assert [g for g, _ in dropped] == [(60, 4)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("pdtop: level 2 [60, 4] dropped: ") and "\n" not in lines[0]


def test_table_takes_what_the_device_realized():
    config = PdmuxConfig(manual_divisions=[[60, 40, 4], [60, 4, 8], [80, 52, 16]])
    table = SplitTable.for_gpu(132, 9, config)
    real = table.realized([(132, 0), (64, 40), None, (80, 52), (0, 132)])
    assert real.groups == [(132, 0), (64, 40), (80, 52), (0, 132)] and real.thresholds == (4, 16)
    assert real.choose(20, True, config) == 2 and real.choose(5, True, config) == 1
    assert table.realized(table.groups) == table


def test_describe_names_the_gpu_as_nvml_does():
    info = GreenContexts(driver=FakeDriver()).describe()
    assert info["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert info["pci_bus_id"] == "0000:65:00.0" and info["name"] == "NVIDIA H200"
    assert info["partition_limits"] == {"min_sms": 8, "align": 8, "source": "driver"}
