"""quant.c's spin team (csrc/spin_team.h), which runs a decode step's matmuls over threads (per-row
dots and panels; quant_k.c's too): the same results as OpenMP's team and as the reference, from any
thread, following the caller's affinity, stopped with its thread, and absent in a forked child."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from pdtop.engine.model import quant_kernels

BASE = sorted(quant_kernels.BASE_TYPES)
MORE = sorted(quant_kernels.MORE_TYPES)
SHAPES = [(quant_kernels.TEAM_ROWS, 96), (1000, 576), (49157, 64)]  # out, in: odd tiles, every member's range


@pytest.fixture(scope="module")
def kernels() -> quant_kernels.QuantKernels:
    k = quant_kernels.kernels()
    if k is None or k.fast == 0:
        pytest.skip("no AVX2 quant kernels here (the team runs their per-row dots)")
    return k


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def team_threads() -> dict[int, str]:
    """tid -> Cpus_allowed_list of this process's spin-team helpers."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "pdtop-team":
                status = (task / "status").read_text().splitlines()
                out[int(task.name)] = next(x.split()[1] for x in status if x.startswith("Cpus_allowed_list"))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def wait_for(cond, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def matmuls(k: quant_kernels.QuantKernels, qtype: int, out_f: int, in_f: int, n: int) -> tuple[torch.Tensor, ...]:
    """(on the team, on OpenMP's team, the int8 reference) for a random weight and input."""
    raw, dense = quant_kernels.random_blocks(qtype, out_f, in_f, seed=out_f + n)
    x = torch.randn(n, in_f, generator=torch.Generator().manual_seed(n)) * 3
    w = torch.from_numpy(raw)
    team = k.matmul(qtype, w, in_f, x)
    spin = k.lib.pdtop_quant_team_spin(-1)
    try:
        omp = k.matmul(qtype, w, in_f, x)
    finally:
        k.lib.pdtop_quant_team_spin(spin)
    return team, omp, quant_kernels.round_activations(x, quant_kernels.block_len(qtype)) @ torch.from_numpy(dense).T


@pytest.mark.parametrize("qtype", BASE, ids=[quant_kernels.QUANT_TYPES[t] for t in BASE])
def test_team_matches_openmp_and_the_reference(kernels, qtype, two_threads):
    cases = [*zip(SHAPES, (1, 2, 1), strict=True), *(((1000, 576), n) for n in (3, 5, 32)),
             ((quant_kernels.TEAM_ROWS, 96), 7)]  # and the panels of a few rows (3 on)
    for (out_f, in_f), n in cases:
        team, omp, want = matmuls(kernels, qtype, out_f, in_f, n)
        assert torch.equal(team, omp), (out_f, in_f, n)
        scale = float(want.abs().max())
        assert torch.allclose(team, want, atol=quant_kernels.EXACT_TOL * scale, rtol=quant_kernels.EXACT_TOL)
    assert team_threads(), "the matmuls above ran on OpenMP's team, not the spin team"


@pytest.mark.parametrize("qtype", MORE, ids=[quant_kernels.QUANT_TYPES[t] for t in MORE])
def test_quant_k_runs_on_the_same_team(kernels, qtype, two_threads):
    if qtype not in kernels.types:
        pytest.skip(f"{quant_kernels.QUANT_TYPES[qtype]} is not built here")
    before, seen, done = set(team_threads()), [], threading.Event()

    def worker() -> None:  # a thread of its own: a team appears only if quant_k.c starts one
        torch.set_num_threads(2)
        for (out_f, in_f), n in (((1031, 256), 1), ((1031, 512), 2)):
            team, omp, want = matmuls(kernels, qtype, out_f, in_f, n)
            assert torch.equal(team, omp), (out_f, in_f, n)
            scale = float(want.abs().max())
            assert torch.allclose(team, want, atol=quant_kernels.EXACT_TOL * scale, rtol=quant_kernels.EXACT_TOL)
        seen.append(set(team_threads()) - before)
        done.set()

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert done.is_set(), "the matmuls failed (see the thread's exception above)"
    assert seen[0], "quant_k.c's matmuls did not run on the spin team"


def test_a_thread_gets_its_own_team_on_its_cores_and_stops_it_when_it_ends(kernels):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to narrow")
    results: dict[str, object] = {}
    stop = threading.Event()
    before = set(team_threads())

    def worker() -> None:
        torch.set_num_threads(2)  # per calling thread (libgomp)
        matmuls(kernels, 3, quant_kernels.TEAM_ROWS, 96, 1)  # the team starts on every core
        os.sched_setaffinity(threading.get_native_id(), {cores[-1]})  # as CpuDevice narrows its threads
        team, omp, _ = matmuls(kernels, 3, quant_kernels.TEAM_ROWS, 96, 1)
        results["equal"] = torch.equal(team, omp)
        stop.wait(10)

    th = threading.Thread(target=worker)
    th.start()
    try:
        assert wait_for(lambda: "equal" in results, 30)
        assert results["equal"] is True
        mine = {t: c for t, c in team_threads().items() if t not in before}
        assert mine, "the thread started no helpers"
        # a helper takes its caller's new affinity with the next job it sees
        assert wait_for(lambda: all(team_threads().get(t, str(cores[-1])) == str(cores[-1]) for t in mine)), \
            team_threads()
    finally:
        stop.set()
        th.join()
    assert wait_for(lambda: not set(team_threads()) & set(mine)), "the helpers outlived their thread"


def test_a_forked_child_runs_without_the_parents_helpers(kernels, two_threads):
    team, _, _ = matmuls(kernels, 3, quant_kernels.TEAM_ROWS, 96, 1)
    assert team_threads()
    pid = os.fork()
    if pid == 0:  # the child: the same matmul on a team of its own (the parent's helpers are not here)
        try:
            raw, _ = quant_kernels.random_blocks(3, quant_kernels.TEAM_ROWS, 96, seed=quant_kernels.TEAM_ROWS + 1)
            x = torch.randn(1, 96, generator=torch.Generator().manual_seed(1)) * 3
            again = kernels.matmul(3, torch.from_numpy(raw), 96, x)
            os._exit(0 if torch.equal(again, team) and team_threads() else 1)
        except BaseException:
            os._exit(2)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on its parent's team")
