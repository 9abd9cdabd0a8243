"""The CUDA path's decisions that need no GPU: dtype defaults, KV sizing, graph buckets, decode splits,
prefill slices in flight, and every `--device cuda` entry point failing in one line without a GPU."""
from __future__ import annotations

import math
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest
import torch

from pdtop.engine.build import build_engine, default_dtype
from pdtop.engine.devices.sim import SimDevice, _Running
from pdtop.engine.errors import EngineError
from pdtop.engine.model.config import synthetic_config
from pdtop.engine.model.paged_attention import decode_splits
from pdtop.engine.roofline.gpu_specs import parse_gpu
from pdtop.engine.runtime.cuda_graphs import DEFAULT_BUCKETS, bucket_for
from pdtop.engine.runtime.executor import SimExecutor
from pdtop.engine.runtime.kv_sizing import GiB, activation_reserve, plan_kv
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.scheduler import Scheduler
from pdtop.engine.scheduling.splits import SplitTable

ROOT = Path(__file__).resolve().parents[3]
QWEN = synthetic_config("qwen3-8b")


def test_default_dtype_per_device():
    assert default_dtype("cuda") == "bfloat16"
    assert default_dtype("cpu") == "float32"
    engine = build_engine("cpu", "synthetic:smollm2-135m")
    try:
        runtime = engine.describe().runtime
        assert runtime["dtype"] == "float32" and runtime["kv_cache"]["tokens"] == 16384
        assert runtime["kv_cache"]["line"].startswith("KV cache: 16,384 tokens")
    finally:
        engine.close()


# -- KV sizing ----------------------------------------------------------------------------
H200_TOTAL = int(139.8 * GiB)
PER_TOKEN = QWEN.kv_bytes_per_token(2)
RESERVE = activation_reserve(QWEN, 2, 8192)


def test_kv_sized_from_free_memory():
    free = H200_TOTAL - int(17.5 * GiB)  # weights and the context taken
    plan = plan_kv(PER_TOKEN, free, H200_TOTAL, RESERVE)
    limit = 0.9 * H200_TOTAL - (H200_TOTAL - free) - RESERVE
    assert plan.tokens % 16 == 0 and plan.bytes == plan.tokens * PER_TOKEN
    assert plan.bytes <= limit < plan.bytes + 16 * PER_TOKEN  # all of the budget, in whole blocks
    assert plan.tokens > 205_000  # `pdtop bench --device cuda`'s scenario fits an H200
    assert "0.9 of 139.8 GiB" in plan.line()
    half = plan_kv(PER_TOKEN, free, H200_TOTAL, RESERVE, fraction=0.5)
    assert half.tokens < plan.tokens


def test_kv_tokens_asked_for_must_fit():
    free = 20 * GiB
    plan = plan_kv(PER_TOKEN, free, H200_TOTAL, RESERVE, tokens=50_000)
    assert plan.tokens == 50_000 and "--kv-tokens" in plan.how
    with pytest.raises(EngineError, match=r"^--kv-tokens 200,000 needs 27\.5 GiB; only") as info:
        plan_kv(PER_TOKEN, free, H200_TOTAL, RESERVE, tokens=200_000)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("free,fraction,words", [
    (int(1.5 * GiB), None, "no room for a KV cache"),  # weights took nearly everything
    (100 * GiB, 0.0, "--gpu-memory-fraction must be in (0, 1]"),
    (100 * GiB, 1.5, "--gpu-memory-fraction must be in (0, 1]"),
    (100 * GiB, 0.1, "no room for a KV cache"),  # 14 GiB allowed, 40 already used
])
def test_kv_sizing_refusals(free, fraction, words):
    with pytest.raises(EngineError) as info:
        plan_kv(PER_TOKEN, free, H200_TOTAL, RESERVE, fraction=fraction)
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_gpu_memory_fraction_is_refused_on_the_cpu():
    with pytest.raises(EngineError, match="applies to cuda devices"):
        build_engine("cpu", "synthetic:smollm2-135m", gpu_memory_fraction=0.5)


def test_a_scenario_that_does_not_fit_stops_before_starting():
    r = subprocess.run([sys.executable, "-m", "pdtop", "bench", "--device", "cpu", "--policy", "pdmux",
                        "--kv-tokens", "4096"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    from pdtop.bench.policy_bench import SCENARIOS

    sc = SCENARIOS["cpu"]  # its decode budget (1,500) is under SmolLM2's 8,192-token context, so it is not capped
    need = sc.kv_tokens(sc.decode_tokens)
    assert need > 4096
    assert len(lines) == 1 and f"the scenario needs {need:,} KV tokens" in lines[0] and "holds 4,096" in lines[0]


# -- decode graphs and kernel launch shapes ------------------------------------------------
@pytest.mark.parametrize("rows,bucket", [(1, 1), (3, 4), (17, 24), (24, 24), (25, 32), (33, 48), (64, 64), (65, None)])
def test_graph_bucket_choice(rows, bucket):
    assert bucket_for(rows, DEFAULT_BUCKETS) == bucket


def test_graph_bucket_choice_takes_any_order():
    assert bucket_for(5, (16, 8, 1)) == 8 and bucket_for(17, (16, 8, 1)) is None


@pytest.mark.parametrize("rows,kv_heads,sms,splits", [(32, 8, 132, 2), (1, 8, 132, 16), (64, 8, 132, 1),
                                                     (4, 8, 132, 16), (8, 8, 132, 8), (16, 2, 52, 4)])
def test_decode_splits_cover_the_gpu_twice(rows, kv_heads, sms, splits):
    assert decode_splits(rows, kv_heads, sms) == splits


# -- prefill slices in flight ---------------------------------------------------------------
class PipelinedSim(SimDevice):
    """The simulated GPU taking up to two prefill slices at once, the second starting when the first
    ends (as on one CUDA stream). The clock runs as SimDevice's, with that queue added."""

    max_prefill_in_flight = 2

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.queued: deque[_Running] = deque()  # behind the running slice
        self.finished = 0  # slices done and not yet collected
        self.most_in_flight = 0

    def in_flight(self) -> int:
        return self.finished + int(self.prefill_busy()) + len(self.queued)

    def submit_prefill(self, work):
        assert self.in_flight() < self.max_prefill_in_flight
        job = _Running(work, self.prefill_seconds(work, self._side_units(0)))
        work.run()
        if self.prefill_busy():
            self.queued.append(job)
        else:
            self._prefill = job
        self.most_in_flight = max(self.most_in_flight, self.in_flight())

    def _advance(self, job, deadline=math.inf):
        while self.clock < deadline:
            pf = self._prefill if self.prefill_busy() else None
            if (job is None and pf is None) or (job is not None and job.left <= 0):
                break
            self._run_for([j for j in (job, pf) if j is not None and j.left > 0], deadline)
            if pf is not None and pf.left <= 0:
                self.finished += 1
                if self.queued:
                    self._prefill = self.queued.popleft()
        if deadline < math.inf:
            self.clock = max(self.clock, deadline)

    def collect_prefill(self, in_flight, block=False):
        if block:
            self._advance(None)
        done, self.finished = self.finished, 0
        return done


def _long_prompt_ttft(dev: SimDevice) -> float:
    """16 requests decoding at context 2048, then an 8192-token prompt in 2-layer slices: its TTFT."""
    from pdtop.engine.request import Request, SamplingParams

    config = PdmuxConfig(split_forward_token_budget=16384)
    table = SplitTable.for_gpu(dev.units, 9, config)
    sched = Scheduler(dev, SimExecutor(synthetic_config("qwen3-8b")), table, config)
    for i in range(16):
        sched.add(Request(i, [1] * 2048, SamplingParams(max_tokens=400, ignore_eos=True), 0.0))
    while len(sched.running) < 16:
        sched.step()
    long = Request(99, [1] * 8192, SamplingParams(max_tokens=2, ignore_eos=True), dev.now())
    sched.add(long)
    while not long.output_ids:
        sched.step()
    assert long.num_cached == 8192 and not sched.prefill_in_flight and len(sched.running) == 17
    return long.token_times[0] - long.arrival


def test_two_prefill_slices_in_flight_reach_the_first_token_sooner():
    spec = parse_gpu("H100")
    groups = SplitTable.for_gpu(spec.sms, spec.cc_major, PdmuxConfig()).groups
    one = _long_prompt_ttft(SimDevice(spec, groups))
    pipelined = PipelinedSim(spec, groups)
    two = _long_prompt_ttft(pipelined)
    assert pipelined.most_in_flight == 2
    assert two < one  # no gap on the prefill side between a slice's end and the next round


# -- without a GPU: every --device cuda entry point, one line and exit 2 --------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("args", [
    ["serve", "--device", "cuda", "--port", "0"],
    ["bench", "--device", "cuda", "--policy", "pdmux"],
    ["generate", "--device", "cuda", "hello"],
    ["--device", "cuda"],  # `pdtop` alone is the dashboard
    ["dashboard", "--device", "cuda:1"],
    ["levels", "--device", "cuda"],
    ["tune", "--device", "cuda", "--slo-itl-ms", "50"],
])
def test_cuda_entry_points_without_a_gpu_exit_2_in_one_line(args):
    r = subprocess.run([sys.executable, "-m", "pdtop", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "error:" in lines[0] and ("cuda" in lines[0].lower() or "CPU-only" in lines[0])
    assert not r.stdout
