"""`pdtop tune --launch CMD`: the pattern search of `pdtop tune` over SGLang's knobs, each candidate
measured on a server started for it (`launch.Server`), loaded over HTTP (`tune_http`), and stopped.

- Each candidate's YAML (`dump_pdmux_config`, what SGLang reads) and server log are kept in the
  log directory as `candidate-NNN.yaml` / `.log`.
- The workload is the scenario (`tune_http`) or a dataset's requests (`tune_dataset`).
- Every measurement is appended to `--results` (JSON lines, per-request samples, so a new SLO
  re-scores them); a later run with the same command and workload (the scenario's keys, or the
  dataset file's digest and options), request rate and seed reuses them and goes on.
- A candidate that fails to start, crashes or never gets healthy is recorded with the reason and
  its log's tail, and the search goes on (it counts as missing every SLO); when the first
  `FIRST_FAILURES` launches all fail, the command is broken and the search stops (one line).
- SGLang's default is measured twice first: the spread of the two is the noise. A configuration
  is called better than the default only when its goodput is higher by more than the noise.
- `budget_s` is kept by never starting a candidate that the longest one so far says would not
  finish in time; `max_candidates` caps the launches.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from pdtop.analysis.launch import LaunchError, Server, free_port, substitute
from pdtop.analysis.policy_bench import Scenario
from pdtop.analysis.tune import Measurement, ParetoSearch, SearchRun, SearchSpace, Slo, closest_trials
from pdtop.analysis.tune_dataset import DatasetTraffic, run_dataset
from pdtop.analysis.tune_http import HttpRun, Sample, run_http, score_http
from pdtop.analysis.tune_workload import TuneReport
from pdtop.engine.errors import ConfigError, DeviceError, EngineError, FieldError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, dump_pdmux_config

FAILED = Measurement(math.nan, math.nan, math.nan, math.nan)
RESULTS_VERSION = 1
FIRST_FAILURES = 4  # launches that all fail, from the first: the command itself is broken; stop


@dataclass
class LaunchPlan:
    command: str  # with {config} and {port}
    scenario: Scenario
    request_rate: float  # long prompts per second; inf: one after another
    slo: Slo
    default: PdmuxConfig  # SGLang's default, the budget explicit
    startup_timeout_s: float = 600.0
    run_timeout_s: float = 600.0
    budget_s: float = math.inf
    max_candidates: int | None = None
    log_dir: str = "."
    results: str | None = None
    seed: int = 0
    dataset: DatasetTraffic | None = None  # --dataset-path traffic instead of the scenario (request_rate: all requests)
    tokenizer: str | None = None  # --tokenizer's file name; None: SmolLM2's (results files before it have none)

    def header(self) -> dict[str, Any]:
        """What a results file must match to be reused (the SLOs may change: samples are re-scored)."""
        wl = {k: getattr(self.scenario, k) for k in ("decode_bs", "decode_prompt", "long_tokens", "long_prompts",
                                                      "decode_tokens", "long_max_tokens")}
        if self.dataset is not None:
            wl = self.dataset.identity()
        if self.tokenizer is not None:  # other token counts: another workload
            wl = {**wl, "tokenizer": self.tokenizer}
        rate = "inf" if self.request_rate == math.inf else self.request_rate
        return {"pdtop_tune_launch": RESULTS_VERSION, "command": self.command, "workload": wl,
                "request_rate": rate, "seed": self.seed}


@dataclass
class Outcome:
    """One launch: the HTTP run, or why there is none."""

    config: PdmuxConfig
    run: HttpRun | None
    reason: str = ""
    log_tail: str = ""
    log: str = ""
    elapsed_s: float = 0.0

    def measurement(self, slo: Slo) -> Measurement:
        return FAILED if self.run is None else score_http(self.run, slo)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.to_dict(), "ok": self.run is not None,
                               "elapsed_s": round(self.elapsed_s, 3), "log": self.log}
        if self.run is None:
            out |= {"reason": self.reason, "log_tail": self.log_tail}
        else:
            out |= {"window_s": self.run.window_s, "errors": self.run.errors,
                    "samples": [s.to_json() for s in self.run.samples]}
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Outcome:
        config = PdmuxConfig(**d["config"])
        run = (HttpRun([Sample.from_json(s) for s in d["samples"]], float(d["window_s"]), list(d["errors"]))
               if d["ok"] else None)
        return cls(config, run, str(d.get("reason", "")), str(d.get("log_tail", "")), str(d.get("log", "")),
                   float(d.get("elapsed_s", 0.0)))


def read_results(path: str, header: dict[str, Any]) -> list[Outcome]:
    """The outcomes of an earlier run from `path` (none if it does not exist); FieldError (one line)
    when it is not a results file, or one made with another command or workload."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if n == 1:
                    if record != header:
                        raise FieldError(path, "was written for another command, workload or seed; give another "
                                         "--results file", "--results ")
                    continue
                out.append(Outcome.from_json(record))
            except FieldError:
                raise
            except (ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
                raise FieldError(path, f"line {n} is not a pdtop tune --launch result ({type(exc).__name__})",
                                 "--results ") from None
    return out


@dataclass
class LaunchTuner:
    """Runs candidates for a `ParetoSearch`, reusing earlier outcomes."""

    plan: LaunchPlan
    space: SearchSpace
    prompts: tuple[list[str], list[str]]
    kind: str  # the device kind the candidates' budgets are completed for
    previous: dict[Hashable, list[Outcome]] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)  # this run's and reused ones, in order
    launched: int = 0

    def __post_init__(self) -> None:
        if self.plan.results:
            if not os.path.exists(self.plan.results) or os.path.getsize(self.plan.results) == 0:
                with open(self.plan.results, "w", encoding="utf-8") as f:
                    f.write(json.dumps(self.plan.header()) + "\n")
            for o in read_results(self.plan.results, self.plan.header()):
                self.previous.setdefault(self.space.key(o.config), []).append(o)
        self.launched = sum(len(v) for v in self.previous.values())  # candidate numbers go on

    def outcome(self, config: PdmuxConfig, repeat: int = 0) -> Outcome:
        """The `repeat`-th outcome of `config`'s behaviour: reused from the results, or launched now."""
        earlier = self.previous.get(self.space.key(config), [])
        if repeat < len(earlier):
            o = earlier[repeat]
        else:
            o = self.launch(config)
            if self.plan.results:
                with open(self.plan.results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(o.to_json()) + "\n")
        self.outcomes.append(o)
        return o

    def launch(self, config: PdmuxConfig) -> Outcome:
        self.launched += 1
        base = os.path.join(self.plan.log_dir, f"candidate-{self.launched:03d}")
        config = config.for_device(self.kind)
        with open(base + ".yaml", "w", encoding="utf-8") as f:
            f.write(dump_pdmux_config(config, f"pdtop tune --launch candidate {self.launched}"))
        port = free_port()
        server = Server(substitute(self.plan.command, os.path.abspath(base + ".yaml"), port), port, base + ".log")
        t0 = time.monotonic()
        try:
            server.start()
            server.wait_ready(self.plan.startup_timeout_s)
            plan = self.plan
            run = (run_http(server.url, plan.scenario, plan.request_rate, self.prompts, plan.seed, plan.run_timeout_s)
                   if plan.dataset is None else
                   run_dataset(server.url, plan.dataset, plan.request_rate, plan.seed, plan.run_timeout_s))
            status = server.exited()
            if status is not None:
                raise server.fail(f"the server exited with status {status} during the run")
            if not run.samples:
                raise server.fail("no request finished in the window" + (f": {run.errors[0]}" if run.errors else ""))
            return Outcome(config, run, log=server.log_path, elapsed_s=time.monotonic() - t0)
        except LaunchError as exc:
            return Outcome(config, None, exc.reason, exc.log_tail, server.log_path, time.monotonic() - t0)
        except EngineError as exc:  # requests failed: did the server die?
            status = server.exited(wait_s=1.0)
            reason = str(exc) + (f" (the server exited with status {status})" if status is not None else "")
            return Outcome(config, None, reason, server.fail("").log_tail, server.log_path, time.monotonic() - t0)
        finally:
            server.stop()


@dataclass
class LaunchReport:
    report: TuneReport
    noise_rps: float  # |difference| of goodput between repeats of the same configuration
    default_repeats: list[Measurement]
    kept_default: bool  # the best beat the default by less than the noise: the default stays
    failures: list[Outcome]
    reused: int  # outcomes taken from --results instead of launching


Progress = Callable[[Outcome, Measurement, float], None]


def tune_launch(tuner: LaunchTuner, progress: Progress | None = None, coarse: int = 3) -> LaunchReport:
    plan, slo = tuner.plan, tuner.plan.slo
    t0 = time.monotonic()
    search = ParetoSearch(tuner.space, slo, coarse, reference=plan.default)
    longest = 0.0
    starts = 0

    def fits() -> bool:
        if plan.max_candidates is not None and starts >= plan.max_candidates:
            return False
        return time.monotonic() - t0 + longest <= plan.budget_s

    def measure(config: PdmuxConfig, repeat: int = 0) -> Measurement:
        nonlocal longest, starts
        reused = len(tuner.previous.get(tuner.space.key(config), [])) > repeat
        start = time.monotonic()
        o = tuner.outcome(config, repeat)
        m = o.measurement(slo)
        if not reused:
            starts += 1
            longest = max(longest, time.monotonic() - start)
        if progress is not None:
            progress(o, m, time.monotonic() - t0)
        if len(tuner.outcomes) == FIRST_FAILURES and all(x.run is None for x in tuner.outcomes):
            raise EngineError(f"the first {FIRST_FAILURES} launches all failed, so the command is wrong, not a "
                              f"configuration: {o.reason} (log {o.log})")
        return m

    repeats = [measure(plan.default)]
    default = search.tell(plan.default, repeats[0])
    if fits():
        repeats.append(measure(plan.default, 1))
    complete = True
    while complete and (batch := search.ask()):
        for config in batch:
            if not fits():
                complete = False
                break
            search.tell(config, measure(config))
    noise = _spread([r.goodput_rps for r in repeats])
    best = search.best
    kept = False
    if best is not None and best is not default and fits():
        again = measure(best.config, 1)  # the incumbent repeated: its own noise counts too
        noise = max(noise, _spread([best.result.goodput_rps, again.goodput_rps]))
    if (best is not None and best is not default and slo.met(default.result)
            and best.result.goodput_rps - default.result.goodput_rps <= noise):
        best, kept = default, True
    trials = list(search.trials.values())
    run = SearchRun(len(tuner.outcomes), sum(len(t.points) for t in trials), time.monotonic() - t0, complete)
    report = TuneReport(slo, plan.scenario, default, trials, search.front, best,
                        [] if best is not None else closest_trials(trials, slo), run, tuner.space.size)
    failures = [o for o in tuner.outcomes if o.run is None]
    reused = len(tuner.outcomes) - starts
    return LaunchReport(report, noise, repeats, kept, failures, reused)


def _spread(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) - min(finite) if len(finite) > 1 else 0.0


def dataset_space_scenario(sc: Scenario, dataset: DatasetTraffic) -> Scenario:
    """The scenario a dataset's search space is built for: budgets in layers of its longest prompt, and
    decode batches of 1 up to its requests (at most `sc.decode_bs + sc.long_prompts`, the scenario's most)."""
    most = max(1, min(len(dataset.prompts), sc.decode_bs + sc.long_prompts))
    return dataclasses.replace(sc, decode_bs=1, long_prompts=most - 1, long_tokens=dataset.longest_prompt)


def launch_space_for(device: str, model: str | None, sc: Scenario) -> tuple[SearchSpace, str]:
    """The search space of the device the launched server runs on (its split table, the model's
    layer count), and the device kind; no model is loaded and no GPU memory is taken."""
    from pdtop.analysis.tune_workload import pdmux_space
    from pdtop.engine.build import parse_device
    from pdtop.engine.model.config import synthetic_config
    from pdtop.engine.scheduling.splits import SplitTable

    where = parse_device(device)
    config = PdmuxConfig()
    if where.gpu is not None:
        table = SplitTable.for_gpu(where.gpu.sms, where.gpu.cc_major, config)
    elif where.kind == "cpu":
        from pdtop.engine.devices.cpu import usable_cores

        table = SplitTable.for_cpu(len(usable_cores()), config)
    else:  # asked in a child process, so no CUDA context of pdtop's stays beside the servers
        import subprocess
        import sys

        code = ("import json, sys\nfrom pdtop.engine.devices.cuda_setup import cuda_device_info as i\n"
                f"try:\n    print(json.dumps(i({where.index})))\n"
                "except Exception as exc:\n    sys.exit(str(exc))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise DeviceError((proc.stderr.strip().splitlines() or ["cuda device unavailable"])[-1])
        info = json.loads(proc.stdout)
        table = SplitTable.for_gpu(info["sms"], info["major"], config)
    if model and not model.startswith("synthetic:"):
        from pdtop.engine.model.loader import read_config

        layers = read_config(model).num_layers
    elif model or where.gpu is not None:
        layers = synthetic_config(model or "synthetic:qwen3-8b").num_layers
    else:
        from pdtop.engine.model.loader import default_model_path, read_config

        layers = read_config(default_model_path()).num_layers
    return pdmux_space(table, sc, layers), where.kind
