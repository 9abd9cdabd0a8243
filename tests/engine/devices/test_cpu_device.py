"""The CPU device: prefill and decode threads really run on disjoint cores, concurrently."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from pdtop.engine.devices.base import Work
from pdtop.engine.devices.cpu import CpuDevice
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs at least 2 cores")


def _where() -> tuple[frozenset[int], int]:
    return frozenset(os.sched_getaffinity(0)), torch.get_num_threads()


@pytest.fixture
def device():
    table = SplitTable.for_cpu(len(CORES), PdmuxConfig())
    dev = CpuDevice(table.groups)
    yield dev
    dev.close()


def test_levels_on_this_machine_follow_the_cpu_rule(device):
    n = len(CORES)
    assert device.groups[0] == (n, 0) and device.groups[-1] == (0, n)
    assert all(p + d == n and p >= d >= 1 for p, d in device.groups[1:-1])


def test_split_level_pins_the_two_threads_to_disjoint_cores(device):
    level = 1
    device.set_level(level)
    p_units, d_units = device.groups[level]
    device.submit_prefill(Work("prefill", 0, 0, _where))
    prefill_cores, prefill_threads = device.wait_prefill()
    decode_cores, decode_threads = device.run_decode(Work("decode", 0, 0, _where))
    assert prefill_cores.isdisjoint(decode_cores)
    assert len(prefill_cores) == p_units == prefill_threads
    assert len(decode_cores) == d_units == decode_threads
    assert prefill_cores | decode_cores <= set(CORES)
    assert device.worker_cores() == {"prefill": tuple(sorted(prefill_cores)), "decode": tuple(sorted(decode_cores))}


def test_an_overlapped_level_gives_decode_every_core_and_prefill_its_own():
    """overlap_decode_full_sm on the CPU: decode's team spans all cores, prefill keeps its division's."""
    n = len(CORES)
    config = PdmuxConfig(sm_group_num=3, manual_divisions=[[n // 2, 0, 1]], overlap_decode_full_sm=True)
    table = SplitTable.for_cpu(n, config)
    assert table.groups == [(n, 0), (n // 2, n), (0, n)]
    dev = CpuDevice(table.groups)
    try:
        dev.set_level(1)
        dev.submit_prefill(Work("prefill", 0, 0, _where))
        prefill_cores, prefill_threads = dev.wait_prefill()
        decode_cores, decode_threads = dev.run_decode(Work("decode", 0, 0, _where))
        assert len(prefill_cores) == prefill_threads == n // 2 and prefill_cores < decode_cores
        assert decode_cores == set(CORES) and decode_threads == n
    finally:
        dev.close()


def test_whole_device_levels_give_every_core_to_one_side(device):
    device.set_level(len(device.groups) - 1)
    cores, threads = device.run_decode(Work("decode", 0, 0, _where))
    assert cores == set(CORES) and threads == len(CORES)
    cores, _ = device.run_whole(Work("mixed", 0, 0, _where))
    assert cores == set(CORES)


def test_prefill_runs_concurrently_with_decode(device):
    """The prefill job blocks until a decode job has run: only possible if they overlap."""
    device.set_level(1)
    decode_ran = threading.Event()
    device.submit_prefill(Work("prefill", 0, 0, lambda: decode_ran.wait(timeout=10)))
    assert device.prefill_busy()
    device.run_decode(Work("decode", 0, 0, decode_ran.set))
    assert device.wait_prefill() is True
    assert not device.prefill_busy()


def test_level_change_waits_for_the_prefill_side(device):
    gate = threading.Event()
    device.set_level(1)
    device.submit_prefill(Work("prefill", 0, 0, lambda: gate.wait(timeout=10) and "done"))
    threading.Timer(0.2, gate.set).start()
    device.set_level(0)
    assert not device.prefill_busy() and device.level == 0


def test_errors_in_work_reach_the_caller_and_the_device_stays_usable(device):
    def boom():
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        device.run_decode(Work("decode", 0, 0, boom))
    assert device.run_decode(Work("decode", 0, 0, lambda: 7)) == 7


def _threads_on(cores: set[int]) -> set[int]:
    """This process's threads whose affinity is exactly `cores`."""
    out = set()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if os.sched_getaffinity(tid) == cores:
                out.add(tid)
        except OSError:  # the thread ended meanwhile
            pass
    return out


def test_narrowing_a_worker_also_moves_its_existing_openmp_team():
    """A team thread keeps the affinity it was created with; pin_team moves it onto the worker's cores."""
    from pdtop.engine.model import cpu_kernels

    last = {CORES[-1]}
    seen: dict[str, set[int]] = {}

    def worker() -> None:
        tid = threading.get_native_id()
        os.sched_setaffinity(tid, CORES)
        torch.set_num_threads(2)
        torch.ones(4_000_000).add_(1)  # a parallel region: the team thread is created, on every core
        os.sched_setaffinity(tid, last)
        seen["narrowed"] = _threads_on(last)
        assert cpu_kernels.pin_team(tuple(last))
        seen["pinned"] = _threads_on(last)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(seen["pinned"] - seen["narrowed"]) == 1  # the team's other thread, no longer on every core

