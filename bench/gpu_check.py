#!/usr/bin/env python3
"""GPU check: pdtop's own CUDA path (`CudaDevice`, `ModelRunner`, the scheduler through `Engine`)
on `synthetic:qwen3-8b` in bfloat16 (real shapes, seeded random weights).

    python3 bench/gpu_check.py --out gpu_check-h100.json   # one GPU; at most --budget (270) s
    python3 bench/gpu_check.py --smoke --out smoke.json    # CPU, a 2-layer model: checks this script

Needs torch with CUDA, cuda-python (cuda.bindings), nvidia-ml-py, numpy and this repository
(put on sys.path); nothing that `pdtop serve` or the dashboard add (no gguf, websockets,
textual, fastapi). The JSON is written after every section, so a timeout keeps what was
measured; a section that fails or has no time left is recorded as such, never as numbers.
Sections, in order:

1. environment: driver, torch, cuda-bindings, nvidia-ml-py, triton, CUDA_DEVICE_MAX_CONNECTIONS;
2. device and levels: the table as requested, every level's requested and realized SMs (read
   back from the green contexts, `cuGreenCtxGetDevResource`), each level the driver refused with
   its reason, manual divisions [60, 40] and [60, 4], the partition limits and where they came from;
3. runtime: the model, a `ModelRunner` with its CUDA graphs captured on every level's
   decode stream (graph pool, capture time, attention kernel, prefix-attention mode), and on
   every level one decode step replayed from its graph against the same step run eagerly;
4. decode step (32 requests at context 2048): wall, host (launch) and GPU (CUDA events)
   time, eager against graph, alone (whole GPU, and the decode side of SGLang's level for
   32 requests: 80/52 on 132 SMs) and under 8192-token prefill slices on the prefill side;
5. overlap at every split level: an 8-layer slice of an 8192-token prefill and decode
   steps, each alone and together on their own SMs;
6. policies: pdmux against chunked prefill (2048 and 512) on the engine's own scheduler
   (`pdtop bench`'s scenario: 32 decoding at 2048, three 8192-token prompts), and
   decode-only ITL; `itl_ms` holds the p99s. They run in a child process, which saves after
   every policy: a CUDA error that aborts a process there loses only what it had not saved, and
   this process records how the child ended and goes on;
7. CUDA_DEVICE_MAX_CONNECTIONS 8 against 32: section 4's decode-under-prefill in a child
   process with 8 (this process runs with 32);
8. NVML/GPM samples (NVML's device matched by PCI bus id / UUID) during every section.

It ends with one summary table, and `targets` in the JSON holds every one of issue 30's targets:
true (met), false (not met) or null (not measured), with `target_notes` (`bench/gpu_targets.py`),
computed at every save, so a run killed mid-way still has a verdict of what it measured. Each
graph figure takes `--steps` (200) steps and each eager one `--eager-steps` (100), so no p99 is its
maximum. Sections before the policies leave them their time (pdmux and chunked 2048, the ITL
targets), skipping themselves first.
"""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()  # the budget counts from here: importing torch and CUDA's start are in it
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # pdtop, and gpu_targets beside this script

from pdtop.engine.devices.cuda_setup import max_connections_state, set_max_connections  # noqa: E402

set_max_connections()  # before torch starts CUDA

import gpu_targets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pdtop.analysis.metrics import percentile, summary_ms  # noqa: E402
from pdtop.bench.policy_bench import SCENARIOS, Scenario, decode_only_itls, run_policy  # noqa: E402
from pdtop.engine.build import build_engine  # noqa: E402
from pdtop.engine.devices.base import Work  # noqa: E402
from pdtop.engine.devices.green_ctx import bindings_version  # noqa: E402
from pdtop.engine.model.synthetic import synthetic_model  # noqa: E402
from pdtop.engine.request import Request, RequestStatus, SamplingParams  # noqa: E402
from pdtop.engine.runtime.graph_counts import delta, replayed  # noqa: E402
from pdtop.engine.runtime.runner import ModelRunner  # noqa: E402
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig  # noqa: E402
from pdtop.engine.scheduling.splits import choose, prefill_layers_per_step  # noqa: E402
from pdtop.engine.scheduling.tokens import append_token  # noqa: E402
from pdtop.telemetry.hardware.nvml_sampler import NvmlSampler  # noqa: E402

MODEL = "synthetic:qwen3-8b"
GiB = 1 << 30
GRAPH_CHECK_ROWS = 4  # the one-step comparison's batch: a graph of its own size, no padded rows
GRAPH_TOLERANCE = 0.02  # replayed logits within this fraction of the largest eager logit (other GEMM kernels
# may run under capture: the same math, rounded in another order)


# -- the report: saved after every section ------------------------------------------------
class OutOfTime(BaseException):
    """SIGTERM (the caller's `timeout`): the section in progress stops; what was measured is kept."""


def _out_of_time(signum: int, frame: Any) -> None:
    raise OutOfTime


class Report:
    """The JSON report, saved after every section with its verdict; the budget's clock."""

    def __init__(self, path: Path, budget_s: float, mode: str, verdict: bool = True):
        self.path, self.t0, self.budget, self.verdict = path, STARTED, budget_s, verdict
        self.section = "start"
        self.data: dict[str, Any] = {"schema": 1, "mode": mode, "model": MODEL,
                                     "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                                     "errors": {}, "skipped": {}, "seconds": {}}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def save(self) -> None:
        """Write the JSON (replacing the last one whole), the targets computed from what it holds: a run
        killed at any point leaves the verdict of what it had measured (issue 43)."""
        self.data["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        if self.verdict:
            self.data["targets"], self.data["target_notes"] = gpu_targets.targets(_clean(self.data))
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(_clean(self.data), indent=1, default=str))
        tmp.replace(self.path)

    def run(self, name: str, fn: Callable[[], Any], need_s: float = 0.0, reserve_s: float = 0.0) -> Any:
        """Run one section if the budget leaves it `need_s` beyond `reserve_s` (kept for a later section
        that comes first: the policies); record its error or that it had no time, and save."""
        if self.left() - reserve_s < need_s:
            kept = f" beside the {reserve_s:.0f} s kept for the policies" if reserve_s else ""
            self.data["skipped"][name] = f"{self.left():.0f} s of the budget left, about {need_s:.0f} s needed{kept}"
            print(f"[gpu_check] {name}: skipped ({self.data['skipped'][name]})", flush=True)
            self.save()
            return None
        self.section = name
        self.data["running"] = name  # left in the JSON if the process dies in this section
        self.save()
        print(f"[gpu_check] {name} ({self.left():.0f} s left)", flush=True)
        t = time.perf_counter()
        try:
            return fn()
        except Exception as exc:
            tb = traceback.format_exc().strip().splitlines()
            self.data["errors"][name] = f"{type(exc).__name__}: {str(exc).strip()[:300]} | " + " / ".join(tb[-4:])
            print(f"[gpu_check] {name}: FAILED {self.data['errors'][name]}", flush=True)
            return None
        finally:
            self.data["seconds"][name] = round(time.perf_counter() - t, 1)
            del self.data["running"]
            self.save()


def _clean(x: Any) -> Any:
    """Strict JSON: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ended(returncode: int) -> str:
    """How a child process ended, in words: `died of SIGABRT`, `exited 1`."""
    if returncode < 0:
        try:
            return f"died of {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died of signal {-returncode}"
    return f"exited {returncode}"


def _death(stderr: str) -> str:
    """The line of a dead process's stderr that says why: a C++ exception's `what():` (torch's CUDA errors
    thrown where they cannot be caught), else the last line naming an error, else the last line."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip() and not x.lstrip().startswith(("frame #", "File "))]
    what = [x for x in lines if x.startswith("what():")]
    named = [x for x in lines if "rror" in x]
    return " ".join((what[:1] or named[-1:] or lines[-1:] or ["nothing on stderr"])[0].split())[:300]


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "mean": float(np.mean(values)) if values
            else math.nan, "n": len(values)}


# -- NVML samples, tagged with the section running ----------------------------------------
class NvmlLog:
    def __init__(self, report: Report, sampler: NvmlSampler, interval: float = 0.2):
        self.report, self.sampler, self.interval = report, sampler, interval
        self.samples: list[tuple[str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-check-nvml", daemon=True)

    def start(self) -> NvmlLog:
        if self.sampler.available:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append((self.report.section, self.sampler.sample()))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        out: dict[str, Any] = {"device": self.sampler.describe(), "interval_s": self.interval, "sections": {}}
        for section, rows in itertools.groupby(self.samples, key=lambda r: r[0]):
            rows_ = [r for _, r in rows]
            summary = {}
            for key in ("sm_util_pct", "dram_bw_util_pct", "sm_occupancy_pct", "gpu_util_pct", "power_w",
                        "sm_clock_mhz", "mem_used_mib"):
                vals = [r[key] for r in rows_ if isinstance(r.get(key), (int, float))]
                summary[key] = {"mean": round(float(np.mean(vals)), 1), "max": max(vals)} if vals else "n/a"
            out["sections"].setdefault(section, []).append({"samples": len(rows_), **summary})
        self.sampler.close()
        return out


# -- decode requests and prefill feeding on pdtop's runner --------------------------------
def decoders(runner: ModelRunner, n: int, context: int, seed: int = 0) -> list[Request]:
    """n requests prefilled to `context` tokens (whole device, 8192 tokens per batch), decoding."""
    vocab = runner.config.vocab
    rng = np.random.default_rng(seed)
    reqs = [Request(i, rng.integers(0, vocab, context).tolist(), SamplingParams(max_tokens=64, ignore_eos=True))
            for i in range(n)]
    per_batch = max(1, 8192 // context)
    for i in range(0, n, per_batch):
        batch = reqs[i:i + per_batch]
        for r in batch:
            runner.admit(r)
            r.status = RequestStatus.PREFILLING
        for r, token in zip(batch, runner.prefill(batch), strict=True):
            append_token(r, token, 0.0, ())
    return reqs


class PrefillFeeder:
    """Keeps `tokens`-token prefills going on the device's prefill side, slice after slice (as pdmux
    does: k layers per slice, at most `max_prefill_in_flight` queued), timing each slice on the GPU."""

    def __init__(self, dev: Any, runner: ModelRunner, tokens: int = 8192, seed: int = 1):
        self.dev, self.runner, self.tokens = dev, runner, tokens
        self.layers = runner.config.num_layers
        self.k = prefill_layers_per_step(tokens, self.layers)
        self.rng = np.random.default_rng(seed)
        self.req: Request | None = None
        self.state: Any = None
        self.next = 0
        self.in_flight: deque[tuple[int, Any, Any]] = deque()  # (end layer, start event, end event)
        self.slice_ms: list[float] = []
        self.prefills = 0
        self._ids = itertools.count(10_000)

    def _slice(self, start: int, end: int) -> Work:
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

        def run() -> None:
            events[0].record()
            self.runner.prefill_layers(self.state, start, end)
            events[1].record()

        self.in_flight.append((end, *events))
        return Work("prefill", 0.0, 0.0, run)

    def top_up(self) -> None:
        """Collect finished slices, finish a prefill that is done, start a new one, queue slices."""
        for _ in range(self.dev.collect_prefill(len(self.in_flight))):
            _, e0, e1 = self.in_flight.popleft()
            self.slice_ms.append(e0.elapsed_time(e1))
        if self.state is not None and self.next == self.layers and not self.in_flight:
            assert self.req is not None  # set with the state
            self.runner.prefill_finish(self.state)
            self.runner.free(self.req)
            self.state, self.prefills = None, self.prefills + 1
        if self.state is None:
            ids = self.rng.integers(0, self.runner.config.vocab, self.tokens).tolist()
            self.req = Request(next(self._ids), ids, SamplingParams(max_tokens=1, ignore_eos=True))
            self.runner.admit(self.req)
            self.req.status = RequestStatus.PREFILLING
            self.state, self.next = self.runner.prefill_begin([self.req]), 0
        while self.next < self.layers and len(self.in_flight) < self.dev.max_prefill_in_flight:
            end = min(self.layers, self.next + self.k)
            self.dev.submit_prefill(self._slice(self.next, end))
            self.next = end

    def drain(self) -> None:
        """Finish what is in flight and the prefill under way (all layers), leaving nothing behind."""
        while self.state is not None:
            self.dev.collect_prefill(len(self.in_flight), block=True)
            self.in_flight.clear()
            if self.next < self.layers:
                self.runner.prefill_layers(self.state, self.next, self.layers)
                self.next = self.layers
            assert self.req is not None  # set with the state
            self.runner.prefill_finish(self.state)
            self.runner.free(self.req)
            self.state = None


def time_decode(dev: Any, runner: ModelRunner, reqs: list[Request], steps: int, feeder: PrefillFeeder | None = None,
                warmup: int = 3, min_slices: int = 0) -> dict[str, Any]:
    """Decode steps on the current level's decode stream: host (launch returns), GPU (events), wall (synced);
    with a feeder, prefill slices run meanwhile (and steps go on until `min_slices` of them are timed)."""
    stream = dev.side_streams()[1] if dev is not None else None
    host: list[float] = []
    gpu: list[float] = []
    wall: list[float] = []
    i = 0
    while i < warmup + steps or (feeder is not None and len(feeder.slice_ms) < min_slices and i < 20 * steps):
        i += 1
        if feeder is not None:
            feeder.top_up()
        if stream is None:  # CPU: launching is running
            t0 = time.perf_counter()
            runner.next_logits(reqs)
            t1 = t2 = time.perf_counter()
            ms = None
        else:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                e0.record(stream)
                t0 = time.perf_counter()
                runner.next_logits(reqs)  # launches; sampling (what syncs) is left out
                t1 = time.perf_counter()
                e1.record(stream)
            stream.synchronize()
            t2 = time.perf_counter()
            ms = e0.elapsed_time(e1)
        if i > warmup:
            host.append((t1 - t0) * 1e3)
            wall.append((t2 - t0) * 1e3)
            if ms is not None:
                gpu.append(ms)
    out: dict[str, Any] = {"wall_ms": _ms(wall), "host_ms": _ms(host)}
    if gpu:
        out["gpu_ms"] = _ms(gpu)
        out["host_over_gpu"] = float(np.median(host) / np.median(gpu))
    if feeder is not None:
        out["prefill_slice_gpu_ms"] = _ms(feeder.slice_ms)
        out["prefill_layers_per_slice"] = feeder.k
    return out


CHUNKED_EAGER = ("a chunked step that carries a prompt chunk runs its decode rows and the chunk as one forward, "
                 "eagerly (capturing mixed batches would need piecewise graphs per token count, as vLLM's): those "
                 "steps are partly launch-bound, which flatters pdmux against chunked; its decode-only steps replay "
                 "graphs")


def decode_graphs(engine: Any, steps: list[Any], policy: str) -> dict[str, Any]:
    """Whether a policy's measured decode steps could replay CUDA graphs; for chunked, how many of them
    carried a prompt chunk (a chunk in flight after the round, or a first token beside the decode rows)."""
    graphs = bool((engine.executor.describe().get("cuda_graphs") or {}).get("enabled"))
    if policy != "chunked":
        return {"decode_graphs": graphs}
    mixed = sum(1 for s in steps if s.record.prefills or s.record.tokens_emitted > s.record.decode_bs)
    return {"decode_graphs": graphs and mixed == 0, "mixed_steps": mixed, "decode_graphs_note": CHUNKED_EAGER}


def worst_rounds(steps: list[Any], n: int = 5) -> list[dict[str, Any]]:
    """The `n` measured rounds with the longest ITL, each with what ran in it: a round's ITL counts once per
    decoding request, so with 32 decoding one slow round is over 1% of the ITLs and sets the p99 alone."""
    out = []
    for s in sorted((s for s in steps if s.gaps), key=lambda s: max(s.gaps), reverse=True)[:n]:
        r = s.record
        out.append({"segment": s.segment, "round": r.index, "itl_ms": round(max(s.gaps) * 1e3, 2),
                    "decode_step_ms": round(r.decode_step_s * 1e3, 2), "round_ms": round(r.round_s * 1e3, 2),
                    "split": [r.prefill_units, r.decode_units], "decode_bs": r.decode_bs,
                    "tokens_emitted": r.tokens_emitted,
                    "prefills": [[p.layers_done, p.layers_total, p.layers_per_round, p.tokens] for p in r.prefills]})
    return out


def timed(dev: Any, runner: ModelRunner, reqs: list[Request], steps: int, feeder: PrefillFeeder | None = None,
          **kw: Any) -> dict[str, Any]:
    """`time_decode`'s figure with `graph_replayed`: every step it ran, warm-up included, replayed a
    CUDA graph (the decoder's per-stream counts before and after; False on the CPU)."""
    counts = runner.cuda.counts if runner.cuda is not None else None
    before = counts.snapshot() if counts is not None else None
    out = time_decode(dev, runner, reqs, steps, feeder, **kw)
    out["graph_replayed"] = counts is not None and before is not None and replayed(before, counts.snapshot())
    return out


def device_facts(dev: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The report's `device` entry and one `levels` entry per level that runs, from the cuda device's own
    description: beside the levels kept, the table as requested (`levels_requested`, every level) and
    each level the driver refused, with its reason (`dropped_levels`), so the verdict tells a table
    cut to its two whole-device levels from one that ran whole."""
    info = dev.describe().extra
    device = {"name": info["gpu"], "sms": info["sms"], "cc": info["cc"], "driver_cuda": info["driver_cuda"],
              "pci_bus_id": info["pci_bus_id"], "uuid": info["uuid"], "partition_limits": info["partition_limits"],
              "max_connections": info["max_connections"], "levels_requested": info["levels_requested"],
              "dropped_levels": info["dropped_levels"]}
    levels = [{"level": i, "requested": list(req), "realized": list(real), "carve": carve}
              for i, (req, real, carve) in enumerate(zip(dev.requested, dev.realized, dev.carves(), strict=True))]
    return device, levels


def compare_logits(eager: torch.Tensor, graph: torch.Tensor, replayed_: bool) -> dict[str, Any]:
    """One decode step's logits replayed from a CUDA graph against the same step run eagerly: `ok` when
    the graph really replayed and no logit is off by more than GRAPH_TOLERANCE of the largest eager one
    (NaN or infinity never is). Rows whose greedy token agrees are counted, not required: two close
    logits may swap under another rounding order."""
    eager, graph = eager.float(), graph.float()
    diff = (graph - eager).abs().max().item() if eager.shape == graph.shape else math.inf
    scale = eager.abs().max().item()
    same = int((graph.argmax(-1) == eager.argmax(-1)).sum().item()) if eager.shape == graph.shape else 0
    ok = replayed_ and math.isfinite(diff) and math.isfinite(scale) and diff <= GRAPH_TOLERANCE * max(scale, 1e-6)
    return {"replayed": replayed_, "rows": int(eager.shape[0]), "rows_same_argmax": same, "max_abs_diff": diff,
            "max_abs_logit": scale, "ok": ok}


# -- the check ----------------------------------------------------------------------------
class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.smoke = args.smoke
        self.report = Report(Path(args.out), args.budget, "smoke" if args.smoke else "gpu",
                             verdict=not args.connections_probe)
        self.data = self.report.data
        self.tdev = torch.device("cpu" if self.smoke else "cuda:0")
        self.dev: Any = None
        self.model: Any = None
        self.runner: ModelRunner | None = None
        self.nvml: NvmlLog | None = None
        self.decode_bs, self.context, self.long = (4, 64, 256) if self.smoke else (32, 2048, 8192)
        self.chunks = (64, 32) if self.smoke else (2048, 512)
        self.policy_s = 15 if self.smoke else 40  # what one policy run needs left to start

    # 1
    def environment(self) -> None:
        env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "cuda_bindings": bindings_version(), "nvidia_ml_py": _version("nvidia-ml-py"),
               "triton": _version("triton"), "numpy": np.__version__, "max_connections": max_connections_state(),
               "cuda_available": torch.cuda.is_available(), "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
               "preflight": self._preflight()}
        try:
            import pynvml

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = v.decode() if isinstance(v, bytes) else v
        except Exception as exc:
            env["driver"] = f"n/a ({type(exc).__name__})"
        self.data["environment"] = env

    def _preflight(self) -> list[str] | None:
        """bench/gpu_run.sh's preflight lines (`preflight: NAME ok|FAILED (why)`), None when it did not run."""
        path = Path(self.args.preflight) if self.args.preflight else Path(self.args.out).with_name("preflight.txt")
        return path.read_text(errors="replace").splitlines() if path.is_file() else None

    # 2
    def device(self) -> None:
        if self.smoke:
            self.data["device"] = {"name": "cpu", "note": "smoke run: no green contexts"}
            self.data["levels"] = []
            return
        from pdtop.engine.devices.cuda import CudaDevice

        torch.empty(1, device=self.tdev)  # torch's context and first block, before the levels are counted
        free = torch.cuda.mem_get_info(0)[0]
        self.dev = dev = CudaDevice(index=0)
        made_mib = round((free - torch.cuda.mem_get_info(0)[0]) / 2**20, 1)
        info = dev.describe().extra  # the cuda device's own facts
        self.data["device"], self.data["levels"] = device_facts(dev)
        self.data["device"]["levels_memory_mib"] = made_mib  # what its kept green contexts cost the GPU
        self.data["device"]["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GiB, 1)
        try:  # the driver's count checked by where kernels run (sm_probe); a failure leaves the rest standing
            measured: list = dev.measure_sms(time_limit_s=5.0)
        except Exception as exc:
            measured = [None] * len(self.data["levels"])
            self.data["errors"]["device.measured_sms"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        for entry, m in zip(self.data["levels"], measured, strict=True):
            entry["measured_sms"] = m
        manual: list[dict[str, Any]] = []
        for p, d in ((60, 40), (60, 4)):
            try:
                pair = dev.gc.split(p, d)
                manual.append({"requested": [p, d], "realized": list(pair.realized)})
                dev.gc.destroy(pair)
            except Exception as exc:
                manual.append({"requested": [p, d], "dropped": str(exc)})
        self.data["manual_levels"] = manual
        sampler = NvmlSampler(uuid=info["uuid"], pci_bus_id=info["pci_bus_id"])
        self.nvml = NvmlLog(self.report, sampler).start()

    # 3
    def _load_model(self) -> Any:
        """The check's model: `MODEL` in bfloat16 (smoke: a 2-layer float32 smollm2), seeded: the same in
        every process."""
        layers = self.args.layers or (2 if self.smoke else None)
        name = "synthetic:smollm2-135m" if self.smoke else MODEL
        return synthetic_model(name, dtype="float32" if self.smoke else "bfloat16", device=self.tdev,
                               num_layers=layers)

    def runtime(self) -> None:
        t = time.perf_counter()
        self.model = self._load_model()
        load_s = time.perf_counter() - t
        kv = 4096 if self.smoke else 131072
        self.runner = ModelRunner(self.model, kv)
        if self.dev is not None and self.runner.cuda is not None:
            self.dev.add_streams_listener(self.runner.cuda.sync_streams)
        self.data["runtime"] = {"model_load_s": round(load_s, 1), "layers": self.model.config.num_layers,
                                **self.runner.describe()}
        if not self.smoke:
            self.data["runtime"]["memory_gib"] = {"allocated": round(torch.cuda.memory_allocated() / GiB, 1),
                                                  "reserved": round(torch.cuda.memory_reserved() / GiB, 1)}

    # 3b
    def graph_vs_eager(self) -> None:
        """On every level, one decode step replayed from the level's CUDA graph against the same step run
        eagerly on the same stream (`compare_logits`), in `levels[i].graph_vs_eager`: `graph_replayed`
        counts replays; this says they compute what the model computes."""
        runner = self.runner
        assert runner is not None
        cuda = runner.cuda
        if self.dev is None or cuda is None or not cuda.use_graphs:
            self.data["graph_vs_eager"] = "needs the cuda device with CUDA graphs"
            return
        reqs = decoders(runner, GRAPH_CHECK_ROWS, self.context, seed=3)
        self.data["graph_vs_eager"] = {"rows": GRAPH_CHECK_ROWS, "context": self.context, "tolerance": GRAPH_TOLERANCE}
        try:
            for level, entry in enumerate(self.data["levels"]):
                self.dev.set_level(level)
                stream = self.dev.side_streams()[1]
                with torch.cuda.stream(stream):
                    cuda.use_graphs = False
                    eager = runner.next_logits(reqs).clone()
                    cuda.use_graphs = True
                    before = cuda.counts.snapshot()
                    graph = runner.next_logits(reqs).clone()  # the graphs' buffer: copied before the next step
                    ran = replayed(before, cuda.counts.snapshot())
                stream.synchronize()
                entry["graph_vs_eager"] = compare_logits(eager, graph, ran)
                self.report.save()
        finally:
            cuda.use_graphs = cuda.graphs_wanted and cuda.paged
            for r in reqs:
                runner.free(r)

    def _pdmux_level(self) -> int:
        return choose(self.dev.groups, self.decode_bs, True)

    # 4
    def decode(self) -> None:
        runner = self.runner
        assert runner is not None
        reqs = decoders(runner, self.decode_bs, self.context)
        out: dict[str, Any] = {"batch": self.decode_bs, "context": self.context}
        self.data["decode_step"] = out  # what was measured stays if a later figure fails
        modes = ("eager",) if runner.cuda is None or not runner.cuda.use_graphs else ("eager", "graph")
        try:
            for mode in modes:
                if runner.cuda is not None:
                    runner.cuda.use_graphs = mode == "graph"
                steps = self.args.steps if mode == "graph" else self.args.eager_steps  # eager: enough for a p99
                res: dict[str, Any] = {"steps": steps}
                out[mode] = res
                if self.dev is None:
                    res["alone"] = timed(None, runner, reqs, steps)
                else:
                    last, split = len(self.dev.groups) - 1, self._pdmux_level()
                    res["level"] = {"index": split, "realized": list(self.dev.groups[split])}
                    self.dev.set_level(last)
                    res["alone_whole_gpu"] = timed(self.dev, runner, reqs, steps)
                    self.dev.set_level(split)
                    res["alone_decode_side"] = timed(self.dev, runner, reqs, steps)
                    feeder = PrefillFeeder(self.dev, runner, self.long)
                    res["under_prefill"] = timed(self.dev, runner, reqs, steps, feeder)
                    feeder.drain()
                self.report.save()
        finally:  # a failed figure leaves neither graphs off nor 32 requests' KV to the sections after it
            if runner.cuda is not None:
                runner.cuda.use_graphs = runner.cuda.graphs_wanted and runner.cuda.paged
            for r in reqs:
                runner.free(r)

    # 5
    def overlap(self) -> None:
        if self.dev is None:
            self.data["overlap"] = "needs the cuda device"
            return
        runner = self.runner
        assert runner is not None
        reqs = decoders(runner, self.decode_bs, self.context, seed=2)
        try:
            self._overlap_rows(runner, reqs)
        finally:
            for r in reqs:
                runner.free(r)

    def _overlap_rows(self, runner: ModelRunner, reqs: list[Request]) -> None:
        rows: list[dict[str, Any]] = []
        for level in range(1, len(self.dev.groups) - 1):
            self.dev.set_level(level)
            feeder = PrefillFeeder(self.dev, runner, self.long, seed=level)
            feeder.top_up()  # one prefill begun, its first slices queued: time them alone
            self.dev.collect_prefill(len(feeder.in_flight), block=True)
            alone_ms = [e0.elapsed_time(e1) for _, e0, e1 in feeder.in_flight]
            feeder.in_flight.clear()
            decode_alone = timed(self.dev, runner, reqs, 8, warmup=2)
            together = timed(self.dev, runner, reqs, 8, feeder, warmup=0, min_slices=2)
            feeder.drain()
            p_alone = float(np.mean(alone_ms))
            p_together = together["prefill_slice_gpu_ms"]["p50"]
            rows.append({"level": level, "realized": list(self.dev.groups[level]),
                         "prefill_slice_ms": {"alone": p_alone, "with_decode": p_together},
                         "decode_step_ms": {"alone": decode_alone["wall_ms"]["p50"],
                                            "with_prefill": together["wall_ms"]["p50"]},
                         "graph_replayed": decode_alone["graph_replayed"] and together["graph_replayed"],
                         "prefill_slowdown": p_together / p_alone if p_alone else None,
                         "decode_slowdown": together["wall_ms"]["p50"] / decode_alone["wall_ms"]["p50"]})
            self.data["overlap"] = rows
            self.report.save()

    def _free_gpu(self) -> None:
        """This process's GPU memory given up for the policies' process: the device's decode graphs (its
        levels stay alive, for the process's life), the runner's KV cache and the model."""
        if self.dev is not None:
            self.dev.close()
            self.dev = None
        self.runner = self.model = None
        gc.collect()
        if not self.smoke:
            torch.cuda.empty_cache()

    # 6
    def policies(self) -> None:
        """The policy runs in a child process (`--policies-child`, its own model and engines): a CUDA error
        that aborts a process (the first H100 run's did, in a destructor) loses only what the child had
        not saved; this process merges what it saved, records how it ended and goes on."""
        self._free_gpu()
        tmp = Path(tempfile.gettempdir()) / f"gpu_check_policies_{os.getpid()}.json"
        tmp.unlink(missing_ok=True)
        timeout = max(10.0, self.report.left())
        proc = subprocess.Popen(self._policies_command(tmp), stderr=subprocess.PIPE, text=True)
        try:
            err = proc.communicate(timeout=timeout)[1]
            why = None if proc.returncode in (0, 124) else f"its process {_ended(proc.returncode)}: {_death(err)}"
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1]
            why = f"its process did not finish in {timeout:.0f} s and was killed"
        finally:
            if proc.poll() is None:  # this process stopped (SIGTERM): the child goes too
                proc.kill()
                proc.wait()
            self._merge_policies(tmp)
        sys.stderr.write(err)
        if why:
            self.data["errors"]["policies"] = why
            print(f"[gpu_check] policies: FAILED {why}", flush=True)

    def _policies_command(self, out: Path) -> list[str]:
        cmd = [sys.executable, __file__, "--policies-child", "--out", str(out),
               "--budget", f"{self.report.left() - 5:.0f}", "--kv-tokens", str(self.args.kv_tokens)]
        return cmd + (["--smoke"] if self.smoke else []) + (["--layers", str(self.args.layers)] if self.args.layers
                                                              else [])

    def _merge_policies(self, path: Path) -> None:
        """What the policies' process last saved: `policies`, `itl_ms`, its errors and skips."""
        try:
            child = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        finally:
            path.unlink(missing_ok=True)
        for key in ("policies", "itl_ms"):
            if key in child:
                self.data[key] = child[key]
        for key in ("errors", "skipped"):
            self.data[key].update(child.get(key) or {})
        if child.get("policy_running"):
            self.data["skipped"][f"policies.{child['policy_running']}"] = "the policies' process ended during it"

    def policy_runs(self) -> None:
        """Section 6 in the policies' process: each policy on its own engine, saved after each."""
        sc = SCENARIOS["cuda"] if not self.smoke else Scenario(decode_bs=4, decode_prompt=32, long_tokens=128,
                                                                long_prompts=1, decode_tokens=300)
        runs = [("pdmux", "pdmux", PdmuxConfig())] + [
            (f"chunked_{c}", "chunked", PdmuxConfig(chunk_size=c)) for c in self.chunks]
        results: dict[str, Any] = {}
        self.data["policies"] = results
        itl: dict[str, Any] = {}
        self.data["itl_ms"] = itl
        for key, policy, config in runs:
            if self.report.left() < self.policy_s:
                self.data["skipped"][f"policies.{key}"] = f"{self.report.left():.0f} s left"
                continue
            self.data["policy_running"] = key  # left in the JSON if the process dies in this run
            self.report.save()
            engine = build_engine("cpu" if self.smoke else "cuda", MODEL, config, policy, loaded_model=self.model,
                                  kv_capacity_tokens=8192 if self.smoke else self.args.kv_tokens)
            try:
                cuda = getattr(getattr(engine.executor, "runner", None), "cuda", None)
                before = cuda.counts.snapshot() if cuda is not None else None
                t = time.perf_counter()
                run = run_policy(engine, sc)
                res = run.summary
                # how the decoder's steps of the run (its replayed baselines too) really ran; chunked's
                # mixed steps do not go through it (mixed_steps, below)
                res["decode_steps"] = (None if cuda is None or before is None else
                                       delta(before, cuda.counts.snapshot()).as_dict())
                res["seconds"] = round(time.perf_counter() - t, 1)
                res["itl_ms"]["n"] = sum(len(s.gaps) for s in run.steps)
                res["chunk_size"] = config.chunk_size if policy == "chunked" else None
                res["levels"] = [list(g) for g in engine.scheduler.table.groups]
                res.update(decode_graphs(engine, run.steps, policy))
                res["itl_max_ms_by_prompt"] = [round(max((g for st in run.steps if st.segment == seg
                                                          for g in st.gaps), default=math.nan) * 1e3, 2)
                                               for seg in range(sc.long_prompts)]
                res["worst_rounds"] = worst_rounds(run.steps)
                if key == "pdmux":
                    res["decode_only_itl_ms"] = self._decode_only(engine, 30 if self.smoke else 200)
                    itl["decode_only"] = res["decode_only_itl_ms"]["p99"]
                    res["runtime"] = engine.describe().runtime
                results[key] = res
                itl["pdmux_under_prefill" if key == "pdmux" else key] = res["itl_ms"]["p99"]
                del self.data["policy_running"]
                self.report.save()
            finally:
                self.data.pop("policy_running", None)  # a Python error: recorded in `errors` instead
                engine.close()
                del engine
                gc.collect()
                if not self.smoke:
                    torch.cuda.empty_cache()

    @staticmethod
    def _decode_only(engine: Any, rounds: int) -> dict[str, float]:
        """ITLs of the running requests over rounds with nothing to prefill (every unit to decode): the
        gaps inside those rounds only, not each request's gap from the policy run's last token."""
        itls = decode_only_itls(engine, rounds)
        return {**summary_ms(itls), "n": len(itls), "rounds": rounds}

    # 7
    def connections(self) -> None:
        if self.smoke:
            self.data["max_connections"] = "needs a GPU"
            return
        under = ((self.data.get("decode_step") or {}).get("graph") or {}).get("under_prefill")
        level = ((self.data.get("decode_step") or {}).get("graph") or {}).get("level")
        this = {"value": max_connections_state()["value"], "decode_under_prefill": under}
        out: dict[str, Any] = {"this_process": this}
        self.data["max_connections"] = out
        if level is None:
            out["8"] = "not run: section decode_step has no graph figure to compare with"
            return
        tmp = Path(self.args.out).with_name("gpu_check_connections8.json")
        env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "8", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, __file__, "--connections-probe", "--out", str(tmp), "--steps", str(self.args.steps),
               "--probe-split", ",".join(map(str, level["realized"]))]
        timeout = max(10.0, self.report.left() - 5)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            out["8"] = f"not run: the child did not finish in {timeout:.0f} s"
            return
        if r.returncode != 0 or not tmp.exists():
            out["8"] = f"failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:] or r.stdout[-200:]}"
            return
        out["8"] = json.loads(tmp.read_text())
        tmp.unlink()

    def probe(self) -> None:
        """The child of `connections`: decode under prefill at one split level, graphs, this process's env."""
        from pdtop.engine.devices.cuda import CudaDevice

        p, d = (int(x) for x in self.args.probe_split.split(","))
        total = torch.cuda.get_device_properties(0).multi_processor_count
        dev = CudaDevice([(total, 0), (p, d), (0, total)])
        model = synthetic_model(MODEL, dtype="bfloat16", device=self.tdev)
        runner = ModelRunner(model, 81920)
        assert runner.cuda is not None
        runner.cuda.buckets = (self.decode_bs,)  # the one batch size measured
        dev.add_streams_listener(runner.cuda.sync_streams)
        reqs = decoders(runner, self.decode_bs, self.context)
        dev.set_level(1)
        feeder = PrefillFeeder(dev, runner, self.long)
        res = time_decode(dev, runner, reqs, self.args.steps, feeder)
        feeder.drain()
        dev.close()
        self.data.update(value=max_connections_state()["value"], realized=list(dev.groups[1]), decode_under_prefill=res)

    def main(self) -> int:
        r = self.report
        if self.args.connections_probe:
            r.run("probe", self.probe)
            return 0 if not self.data["errors"] else 1
        if self.args.policies_child:
            try:
                self.model = self._load_model()
                r.run("policies", self.policy_runs)
            except OutOfTime:
                return 124
            return 0
        stopped = False
        keep = 2 * self.policy_s + 10  # pdmux and chunked 2048 (the ITL targets) before the figures
        try:
            r.run("environment", self.environment)
            r.run("device", self.device, need_s=5)
            r.run("runtime", self.runtime, need_s=20)
            if self.runner is not None:
                r.run("graph_vs_eager", self.graph_vs_eager, need_s=5, reserve_s=keep)
                r.run("decode_step", self.decode, need_s=15, reserve_s=keep)
                r.run("overlap", self.overlap, need_s=15, reserve_s=keep)
            r.run("policies", self.policies, need_s=self.policy_s + 5)
            r.run("max_connections", self.connections, need_s=40)
        except OutOfTime:
            stopped = True
            self.data["skipped"][r.section] = "stopped by SIGTERM (the caller's timeout) during this section"
            print(f"[gpu_check] {r.section}: stopped by SIGTERM", flush=True)
        if self.nvml is not None:
            self.data["nvml"] = self.nvml.stop()
        elif not self.smoke:
            self.data["nvml"] = "not sampled: no device section"
        else:
            self.data["nvml"] = {"device": NvmlSampler().describe()}
        r.save()
        print(summary(self.data), flush=True)
        if stopped:  # engines and graphs were left mid-step: do not wait for their teardown
            os._exit(124)
        return 0


# -- the summary table --------------------------------------------------------------------
def _f(x: Any, spec: str = ".2f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _yes(x: Any) -> str:
    return "-" if x is None else "yes" if x else "NO"


def summary(d: dict[str, Any]) -> str:
    env, dev = d.get("environment", {}), d.get("device", {})
    lines = [f"gpu_check ({d['mode']}) on {dev.get('name', '?')}: {dev.get('sms', '-')} SMs, driver "
             f"{env.get('driver', '?')}, torch {env.get('torch')}, cuda-bindings {env.get('cuda_bindings')}, "
             f"{d.get('elapsed_s')} s"]
    levels = d.get("levels") or []
    if levels:
        lines.append("levels requested -> realized: " + ", ".join(
            f"{x['requested'][0]}/{x['requested'][1]}" + ("" if x["requested"] == x["realized"] else
                                                          f"->{x['realized'][0]}/{x['realized'][1]}") for x in levels)
            + "; manual " + ", ".join(f"{m['requested']}->{m.get('realized', 'dropped')}"
                                      for m in d.get("manual_levels", [])))
        compared = [(x["level"], x["graph_vs_eager"]) for x in levels if isinstance(x.get("graph_vs_eager"), dict)]
        if compared:
            lines.append("graph vs eager, one step per level (max |diff| / max |logit|): " + ", ".join(
                f"{i}: {'ok' if c.get('ok') else 'NO'} "
                f"{_f(c.get('max_abs_diff'), '.3g')}/{_f(c.get('max_abs_logit'), '.3g')}"
                + ("" if c.get("replayed") else " (not replayed)") for i, c in compared))
    for x in (d.get("device") or {}).get("dropped_levels") or []:
        lines.append(f"dropped level {x.get('level')} {x.get('requested')}: {str(x.get('reason'))[:160]}")
    rt = d.get("runtime") or {}
    if rt:
        g = rt.get("cuda_graphs") or {}
        eager = f" (+{g['eager_streams']} eager: capture failed)" if g.get("eager_streams") else ""
        lines.append(f"runtime: {rt.get('dtype')}, attention {rt.get('attention', 'sdpa')}, prefix "
                     f"{rt.get('prefix_attention', '-')}, graphs {g.get('graphs', 0)} on {g.get('streams', 0)} "
                     f"streams{eager}, pool "
                     f"{g.get('pool_mib', '-')} MiB, capture {g.get('capture_s', '-')} s")
    ds = d.get("decode_step") or {}
    if ds:
        lines.append(f"{'decode step (bs ' + str(ds.get('batch')) + ', ctx ' + str(ds.get('context')) + ')':<40}"
                     f"{'wall p50':>9}{'wall p99':>9}{'host p50':>9}{'gpu p50':>9}{'host/gpu':>9}{'replayed':>9}")
        for mode in ("eager", "graph"):
            for where, row in (ds.get(mode) or {}).items():
                if not isinstance(row, dict) or "wall_ms" not in row:
                    continue
                lines.append(f"  {mode + ' ' + where:<38}{_f(row['wall_ms']['p50']):>9}{_f(row['wall_ms']['p99']):>9}"
                             f"{_f(row['host_ms']['p50']):>9}{_f(row.get('gpu_ms', {}).get('p50')):>9}"
                             f"{_f(row.get('host_over_gpu')):>9}{_yes(row.get('graph_replayed')):>9}")
    ov = d.get("overlap")
    if isinstance(ov, list) and ov:
        lines.append("overlap (prefill slice / decode step slowdown together): " + ", ".join(
            f"{r['realized'][0]}/{r['realized'][1]}: {_f(r['prefill_slowdown'])}x/{_f(r['decode_slowdown'])}x"
            + ("" if r.get("graph_replayed") else " (decode not replayed)") for r in ov))
    itl = d.get("itl_ms") or {}
    if itl:
        lines.append("ITL p99 ms: " + ", ".join(f"{k} {_f(v, '.1f')}" for k, v in itl.items()))
    mc = d.get("max_connections")
    if isinstance(mc, dict):
        this = ((mc.get("this_process") or {}).get("decode_under_prefill") or {}).get("wall_ms", {})
        eight = mc.get("8")
        eight_ms = eight.get("decode_under_prefill", {}).get("wall_ms", {}) if isinstance(eight, dict) else {}
        lines.append(f"CUDA_DEVICE_MAX_CONNECTIONS decode under prefill p50/p99 ms: "
                     f"{(mc.get('this_process') or {}).get('value')}: {_f(this.get('p50'))}/{_f(this.get('p99'))}, "
                     f"8: {_f(eight_ms.get('p50'))}/{_f(eight_ms.get('p99'))}"
                     + ("" if isinstance(eight, dict) else f" ({eight})"))
    notes = d.get("target_notes") or {}
    for name, ok in (d.get("targets") or {}).items():
        note = f" ({notes[name]})" if notes.get(name) else ""
        lines.append(f"target {name}: {gpu_targets.verdict_word(ok)}{note}")
    for name, why in d.get("skipped", {}).items():
        lines.append(f"skipped {name}: {why}")
    for name, err in d.get("errors", {}).items():
        lines.append(f"FAILED {name}: {err[:200]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    ap.add_argument("--smoke", action="store_true", help="CPU, a 2-layer model, a tiny scenario")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds; sections that do not fit are skipped")
    ap.add_argument("--steps", type=int, help="timed decode steps per figure (default 200, enough for a p99 that is "
                    "not the maximum; smoke: 20)")
    ap.add_argument("--eager-steps", type=int, help="timed steps per eager figure (default 100, what a p99 needs: "
                    "the graph figures are the ones compared with targets; smoke: --steps)")
    ap.add_argument("--layers", type=int, help="synthetic model layers (default: all 36; smoke: 2)")
    ap.add_argument("--kv-tokens", type=int, default=229376, help="KV cache of the policy runs (default 229,376)")
    ap.add_argument("--preflight", help="bench/gpu_run.sh's preflight lines, recorded in environment "
                    "(default: preflight.txt beside --out)")
    ap.add_argument("--connections-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--policies-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe-split", default="80,52", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps is None:
        args.steps = 20 if args.smoke else 200
    if args.eager_steps is None:
        args.eager_steps = min(args.steps, 100)
    from pdtop.engine.devices.host import machine_line
    if not args.policies_child:
        print(machine_line(), flush=True)  # the machine these figures come from
    if not args.smoke and not torch.cuda.is_available():  # still a report: what ran, and why nothing more
        why = "no CUDA GPU visible to torch; use --smoke on a CPU"
        print(f"gpu_check: {why}", file=sys.stderr, flush=True)
        check = Check(args)
        check.report.run("environment", check.environment)
        check.data["errors"]["cuda"] = why
        check.report.save()
        print(summary(check.data), flush=True)
        return 2
    torch.manual_seed(0)
    signal.signal(signal.SIGTERM, _out_of_time)  # a timeout still gets the summary table
    return Check(args).main()


if __name__ == "__main__":
    raise SystemExit(main())
