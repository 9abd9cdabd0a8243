"""`pdtop tune` on servers launched per candidate (`tune --launch CMD`): the search over SGLang's knobs,
each candidate measured on a server started for it (`server_process.Server`), loaded over HTTP
(`http_workload`), scored per request (`score.score_http`), and stopped.

- Each candidate's YAML (`dump_pdmux_config`, what SGLang reads) and server log are kept in the
  log directory as `candidate-NNN.yaml` / `.log`.
- The workload is the scenario or a dataset's requests (`http_workload`).
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

import json
import math
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from pdtop.bench.policy_bench import Scenario
from pdtop.engine.errors import ConfigError, EngineError, FieldError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, dump_pdmux_config
from pdtop.tune.http_workload import DatasetTraffic, run_dataset, run_http
from pdtop.tune.report import TuneReport
from pdtop.tune.score import HttpRun, HttpSample, Measurement, Slo, score_http
from pdtop.tune.search import ParetoSearch, SearchRun, SearchSpace, closest_trials
from pdtop.tune.server_process import LaunchError, Server, free_port, substitute

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
        run = (HttpRun([HttpSample.from_json(s) for s in d["samples"]], float(d["window_s"]), list(d["errors"]))
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
            server.check_running("during the run")
            if not run.samples:
                raise server.fail("no request finished in the window" + (f": {run.errors[0]}" if run.errors else ""))
            return Outcome(config, run, log=server.log_path, elapsed_s=time.monotonic() - t0)
        except EngineError as exc:  # LaunchError: the server's fault; another: a request failed (did it die?)
            failure = exc if isinstance(exc, LaunchError) else server.failed_request(exc)
            return Outcome(config, None, failure.reason, failure.log_tail, server.log_path, time.monotonic() - t0)
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


