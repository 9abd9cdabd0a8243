"""`pdtop tune` on servers launched per candidate (`tune --launch CMD`): the adaptive search
(`search.run_search`) with a `LaunchRunner`, each candidate measured on a server (`server_process.Server`),
loaded over HTTP (`http_workload`) and scored per request (`score.score_http`).

- Cheap before expensive: with `{control_port}` in CMD, a server that speaks pdtop's protocol (pdtop
  serve, SGLang with pdtop's plugin) is kept running, and a candidate with its SM counts is measured
  on it after a live `set` of the knobs that need no restart (`live_control`); only a candidate with
  other SM counts (`space.restart_key`) starts a new server. Without it, every candidate gets its own.
- With `{control_port}` in CMD the server's decode rounds are also read, over a read-only connection of
  their own (`round_reader`), during each candidate's window: the ITL p99 the SLO is held against is
  theirs, as on pdtop's own engine. Without it, or where no round arrived (no hello within its connect
  timeout, or no decode round in the window), each request's TPOT stands in, and the report says so once.
- Each candidate's YAML (`dump_pdmux_config`, what the target SGLang reads) and server log are kept in
  the log directory as `candidate-NNN.yaml` / `.log`.
- Every measurement is appended to `--results` (JSON lines, per-request samples, so a new SLO
  re-scores them), and the search's study is kept beside it (`FILE.optuna`); a later run with the same
  command and workload (the scenario's keys, or the dataset file's digest and options), request rate
  and seed reuses both and goes on.
- A candidate that fails to start, crashes or never gets healthy is recorded with the reason and
  its log's tail, and the search goes on (it counts as missing every SLO); when the first
  `FIRST_FAILURES` launches all fail, the command is broken and the search stops (one line).
- SGLang's default is measured twice first (the second time on the same server when it can be kept):
  the spread is the noise. A configuration is called better than the default only when its goodput is
  higher by more than the noise.
- `budget_s` is kept by never starting a candidate that the longest launch so far says would not
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
from typing import TYPE_CHECKING, Any

from pdtop.bench.policy_bench import Scenario
from pdtop.engine.errors import ConfigError, EngineError, FieldError
from pdtop.engine.scheduling.pdmux_config import SGLANG_RELEASE, PdmuxConfig, dump_pdmux_config
from pdtop.tune.http_workload import DatasetTraffic, run_dataset, run_http
from pdtop.tune.live_control import LIVE_KEYS, ControlRefused, LiveControl
from pdtop.tune.report import TuneReport
from pdtop.tune.round_reader import RoundReader
from pdtop.tune.score import MIXED, ROUNDS, TPOT, HttpRun, HttpSample, Measurement, RoundItls, Slo, score_http
from pdtop.tune.search import AdaptiveSearch, closest_trials, run_search
from pdtop.tune.server_process import LaunchError, Server, free_port, substitute
from pdtop.tune.space import TuneSpace, restart_key

if TYPE_CHECKING:
    import optuna

FAILED = Measurement(math.nan, math.nan, math.nan, math.nan)
RESULTS_VERSION = 1
FIRST_FAILURES = 4  # launches that all fail, from the first: the command itself is broken; stop
NO_CONTROL_PORT = "the command names no {control_port}, so the server's rounds cannot be read"


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
    control: bool = False  # the command names {control_port}: its server takes live changes
    sglang: str = SGLANG_RELEASE  # the SGLang the candidates' YAML is written for

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
    """One candidate measured: the HTTP run, or why there is none."""

    config: PdmuxConfig
    run: HttpRun | None
    reason: str = ""
    log_tail: str = ""
    log: str = ""
    elapsed_s: float = 0.0
    live: bool = False  # measured on a running server after a live change, not on a server of its own
    launch: int = 0  # which launch of its run the server was

    def measurement(self, slo: Slo) -> Measurement:
        return FAILED if self.run is None else score_http(self.run, slo)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.to_dict(), "ok": self.run is not None,
                               "elapsed_s": round(self.elapsed_s, 3), "log": self.log, "live": self.live,
                               "launch": self.launch}
        if self.run is None:
            out |= {"reason": self.reason, "log_tail": self.log_tail}
        else:
            out |= {"window_s": self.run.window_s, "errors": self.run.errors,
                    "samples": [s.to_json() for s in self.run.samples]}
            out |= ({"rounds": self.run.rounds.to_json()} if self.run.rounds is not None else
                    {"no_rounds": self.run.no_rounds})
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Outcome:
        config = PdmuxConfig(**d["config"])
        run = (HttpRun([HttpSample.from_json(s) for s in d["samples"]], float(d["window_s"]), list(d["errors"]),
                       rounds=RoundItls.from_json(d["rounds"]) if d.get("rounds") else None,
                       no_rounds=str(d.get("no_rounds", "measured before pdtop read rounds")))
               if d["ok"] else None)
        return cls(config, run, str(d.get("reason", "")), str(d.get("log_tail", "")), str(d.get("log", "")),
                   float(d.get("elapsed_s", 0.0)), bool(d.get("live", False)), int(d.get("launch", 0)))


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
class LaunchRunner:
    """The search's `Runner` on launched servers: each candidate measured on a server started for it, or,
    where the template names `{control_port}` and the running server has the candidate's SM counts, on
    that server after a live `set` of the rest (`live_control`); outcomes of `--results` reused."""

    plan: LaunchPlan
    space: TuneSpace
    prompts: tuple[list[str], list[str]]
    kind: str  # the device kind the candidates' budgets are completed for
    progress: Callable[[Outcome, Measurement, float], None] | None = None
    deterministic: bool = False
    previous: dict[Hashable, list[Outcome]] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)  # this run's and reused ones, in order
    launches: int = 0  # servers started by this run
    reused: int = 0  # outcomes taken from --results
    candidates: int = 0  # candidate numbers (files) used, this run's and earlier ones
    server: Server | None = None
    control: LiveControl | None = None
    rounds: RoundReader | None = None  # the running server's rounds, where its control port speaks pdtop's protocol
    no_rounds: str = ""  # else why not
    running: PdmuxConfig | None = None  # the configuration in force on `server`
    started: float = field(default_factory=time.monotonic)
    longest_s: float = 0.0  # the longest launch so far
    longest_live_s: float = 0.0  # the longest candidate measured on a running server

    def __post_init__(self) -> None:
        if self.plan.results:
            if not os.path.exists(self.plan.results) or os.path.getsize(self.plan.results) == 0:
                with open(self.plan.results, "w", encoding="utf-8") as f:
                    f.write(json.dumps(self.plan.header()) + "\n")
            for o in read_results(self.plan.results, self.plan.header()):
                self.previous.setdefault(self.space.key(o.config), []).append(o)
        self.candidates = sum(len(v) for v in self.previous.values())  # candidate numbers go on

    def live(self) -> PdmuxConfig | None:
        return self.running if self.control is not None and self.server is not None else None

    def fits(self, live: bool) -> bool:
        """`max_candidates` caps the launches; the budget is kept with the longest launch (or live
        candidate) so far."""
        if not live and self.plan.max_candidates is not None and self.launches >= self.plan.max_candidates:
            return False
        longest = self.longest_live_s if live else self.longest_s
        return time.monotonic() - self.started + longest <= self.plan.budget_s

    def measure(self, config: PdmuxConfig, repeat: int) -> Measurement:
        """The `repeat`-th outcome of `config`'s behaviour: reused from the results, or measured now."""
        earlier = self.previous.get(self.space.key(config), [])
        if repeat < len(earlier):
            o = earlier[repeat]
            self.reused += 1
        else:
            o = self._run(config.for_device(self.kind))
            if self.plan.results:
                with open(self.plan.results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(o.to_json()) + "\n")
        self.outcomes.append(o)
        m = o.measurement(self.plan.slo)
        if self.progress is not None:
            self.progress(o, m, time.monotonic() - self.started)
        launched = [x for x in self.outcomes if not x.live]
        if len(launched) == FIRST_FAILURES and all(x.run is None for x in launched) and not o.live:
            raise EngineError(f"the first {FIRST_FAILURES} launches all failed, so the command is wrong, not a "
                              f"configuration: {o.reason} (log {o.log})")
        return m

    def _run(self, config: PdmuxConfig) -> Outcome:
        """On the running server when only live knobs differ and it takes them; else on a new one."""
        self.candidates += 1
        base = os.path.join(self.plan.log_dir, f"candidate-{self.candidates:03d}")
        with open(base + ".yaml", "w", encoding="utf-8") as f:
            f.write(dump_pdmux_config(config, f"pdtop tune --launch candidate {self.candidates}", self.space.sglang))
        if self.live() is not None and self.running is not None and restart_key(self.running) == restart_key(config):
            assert self.control is not None and self.server is not None
            values = config.to_dict()
            t0 = time.monotonic()
            try:
                self.control.set({k: values[k] for k in LIVE_KEYS})
                self.running = config
                outcome = self._measured(config, self.server, t0, live=True)
                self.longest_live_s = max(self.longest_live_s, time.monotonic() - t0)
                return outcome
            except ControlRefused:
                pass  # a server of its own, then
        return self._launch(config, base)

    def _launch(self, config: PdmuxConfig, base: str) -> Outcome:
        self.close()
        self.launches += 1
        port = free_port()
        values = {"{config}": os.path.abspath(base + ".yaml"), "{port}": str(port)}
        control_port = free_port() if self.plan.control else None
        if control_port is not None:
            values["{control_port}"] = str(control_port)
        server = Server(substitute(self.plan.command, values), port, base + ".log")
        t0 = time.monotonic()
        try:
            server.start()
            server.wait_ready(self.plan.startup_timeout_s)
            self.server = server
            if control_port is not None:
                try:
                    self.control = LiveControl(control_port, os.environ.get("PDTOP_TOKEN"))
                except EngineError:
                    self.control = None  # no live changes on this server: each candidate gets its own
                try:
                    self.rounds, self.no_rounds = RoundReader(control_port, os.environ.get("PDTOP_TOKEN")), ""
                except EngineError as exc:  # measured all the same, on its requests' TPOT
                    self.rounds, self.no_rounds = None, f"no round read: {exc}"
            else:
                self.no_rounds = NO_CONTROL_PORT
            outcome = self._measured(config, server, t0, live=False)
        except LaunchError as exc:
            outcome = Outcome(config, None, exc.reason, exc.log_tail, server.log_path, time.monotonic() - t0,
                              launch=self.launches)
        except BaseException:
            self.close(server)
            raise
        self.longest_s = max(self.longest_s, time.monotonic() - t0)
        if outcome.run is not None and self.control is not None:
            self.running = config  # kept for the live candidates that follow
        else:
            self.close(server)
        return outcome

    def _measured(self, config: PdmuxConfig, server: Server, t0: float, live: bool) -> Outcome:
        plan = self.plan
        try:
            if self.rounds is not None:
                self.rounds.begin()
            run = (run_http(server.url, plan.scenario, plan.request_rate, self.prompts, plan.seed, plan.run_timeout_s)
                   if plan.dataset is None else
                   run_dataset(server.url, plan.dataset, plan.request_rate, plan.seed, plan.run_timeout_s))
            server.check_running("during the run")
            run.rounds = self.rounds.window(run.start, run.start + run.window_s) if self.rounds is not None else None
            run.no_rounds = "" if run.rounds is not None else (
                self.no_rounds or "no decode round arrived from the control port in the window")
            if not run.samples:
                raise server.fail("no request finished in the window" + (f": {run.errors[0]}" if run.errors else ""))
            return Outcome(config, run, log=server.log_path, elapsed_s=time.monotonic() - t0, live=live,
                           launch=self.launches)
        except EngineError as exc:  # LaunchError: the server's fault; another: a request failed (did it die?)
            failure = exc if isinstance(exc, LaunchError) else server.failed_request(exc)
            if live:
                self.close()
            return Outcome(config, None, failure.reason, failure.log_tail, server.log_path, time.monotonic() - t0,
                           live=live, launch=self.launches)

    def close(self, server: Server | None = None) -> None:
        """Stop `server` and, when it is the one kept running (or none is named), that one and its control."""
        if server is None or server is self.server:
            if self.control is not None:
                self.control.close()
            if self.rounds is not None:
                self.rounds.close()
            server, self.server, self.control, self.running = server or self.server, None, None, None
            self.rounds = None
        if server is not None:
            server.stop()


@dataclass
class LaunchReport:
    report: TuneReport
    noise_rps: float  # the spread of goodput between repeats of the same configuration
    default_repeats: list[Measurement]
    kept_default: bool  # the best beat the default by less than the noise: the default stays
    failures: list[Outcome]
    reused: int  # measurements of an earlier run (its study, or --results) used instead of measuring
    live: int  # candidates measured after a live change, without a new server
    itl_from: str  # what the ITL figures are: ROUNDS, TPOT or MIXED (score.py)
    itl_note: str  # one line: where they come from, and why TPOT stands in where it does


Progress = Callable[[Outcome, Measurement, float], None]


def study_storage(results: str | None) -> optuna.storages.BaseStorage | None:
    """The search's study beside `--results` (`FILE.optuna`, an Optuna journal), so a run goes on where one
    stopped; None without a results file."""
    if not results:
        return None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(results + ".optuna"))


def study_name(plan: LaunchPlan, sglang: str) -> str:
    """A study per SLO and target SGLang (the scores depend on both; the results file holds the samples)."""
    ttft = "none" if plan.slo.ttft_s is None else f"{plan.slo.ttft_s:g}"
    return f"pdtop-tune itl={plan.slo.itl_s:g} ttft={ttft} sglang={sglang}"


def tune_launch(runner: LaunchRunner, guess: PdmuxConfig | None = None) -> LaunchReport:
    plan, slo, space = runner.plan, runner.plan.slo, runner.space
    t0 = time.monotonic()
    search = AdaptiveSearch(space, slo, plan.seed, study_storage(plan.results), study_name(plan, space.sglang))
    stored = sum(len(t.measurements) for t in search.trials.values())  # measured by an earlier run
    try:
        run = run_search(search, runner, plan.default, guess)
    finally:
        runner.close()
    default = search.measured(plan.default)
    assert default is not None
    best = search.best
    repeats = default.measurements
    noise = max((_spread([m.goodput_rps for m in t.measurements]) for t in search.trials.values()), default=0.0)
    kept = False
    if (best is not None and best is not default and slo.met(default.result)
            and best.result.goodput_rps - default.result.goodput_rps <= noise):
        best, kept = default, True
    trials = sorted(search.trials.values(), key=lambda t: t.order)
    run = dataclasses.replace(run, elapsed_s=time.monotonic() - t0)
    report = TuneReport(slo, plan.scenario, default, trials, search.front, best,
                        [] if best is not None else closest_trials(trials, slo), run, space)
    failures = [o for o in runner.outcomes if o.run is None]
    return LaunchReport(report, noise, repeats, kept, failures, stored + runner.reused,
                        sum(o.live for o in runner.outcomes), *itl_note(runner.outcomes))


def itl_note(outcomes: list[Outcome]) -> tuple[str, str]:
    """What the ITL figures of the measured `outcomes` are (ROUNDS, TPOT or MIXED) and one line that says so,
    with why TPOT stands in where it does (the first reason)."""
    runs = [o.run for o in outcomes if o.run is not None]
    if not runs:
        return TPOT, "no candidate was measured"
    tpot = [r for r in runs if r.rounds is None]
    kind = ROUNDS if not tpot else TPOT if len(tpot) == len(runs) else MIXED
    why = tpot[0].no_rounds if tpot else ""
    if kind == ROUNDS:
        line = ("ITL p99 from the server's decode rounds over each candidate's window (pdtop's protocol on "
                "{control_port}), as pdtop's own engine counts ITL; goodput counts each request's TPOT")
    elif kind == TPOT:
        line = f"ITL column: each request's TPOT p99; {why}"
    else:
        line = (f"ITL/TPOT column: the server's decode rounds' ITL p99 for {len(runs) - len(tpot)} measurements, "
                f"each request's TPOT p99 for {len(tpot)}; {why}")
    return kind, line


def _spread(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) - min(finite) if len(finite) > 1 else 0.0
