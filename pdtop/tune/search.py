"""The search behind `pdtop tune` and `tune --launch`: what to measure next (Optuna's TPE sampler over the
space's knobs), which knobs matter, when to stop, and what it found (the configuration that meets the
SLOs with the most goodput, and the Pareto front of ITL p99 against prefill throughput).

One job: an adaptive search and its driver, shared by every way a candidate is measured (a `Runner`:
pdtop's own engine, or servers launched per candidate with live changes in between).

- **The sampler.** TPE (`optuna.samplers.TPESampler`, multivariate, grouped): the space is mixed and
  conditional (a choice of family, `levels`, each with knobs of its own, most of them integer ranges),
  which TPE models directly and CMA-ES does not (it samples categorical and conditional parameters
  independently), and TPE is useful from ten or so trials where CMA-ES needs populations of them
  (docs/tune.md says more).
- **Start points:** SGLang's default first, then the roofline's guess for the workload, each told to the
  study as any trial is.
- **Behaviours measured once:** configurations with the same `space.key` behave the same on the
  workload; a proposal whose behaviour was measured is told its known value, and measures nothing.
- **Knobs within noise stop varying.** The noise is the spread of repeated measurements (SGLang's
  default measured twice on a noisy device; none on `sim:`). Once a knob has been tried at a few values
  on a few SM layouts, if every trial that has it is within the noise of the others, it is fixed at the
  best trial's value (`optuna.samplers.PartialFixedSampler`). When every knob is fixed, the search is
  done; when no knob ever mattered, it says so. What each knob did is reported as the spread between
  the trials grouped by its value (`effects`).
- **Cheap before expensive:** while a runner holds a server whose knobs can be changed live, the next
  few proposals keep its SM layout (the knobs that need a restart, `Knob.restart`) and come from that
  layout's own small study over the knobs that do not (`ask_live`).
- **Repeats only near the front:** on a noisy device, the best configuration and those within the noise
  of it are measured once more at the end, and figures are the mean of their measurements.
- **Stops** when every knob is fixed, when `patience` measured candidates in a row (and, where candidates
  start servers, `LAUNCH_PATIENCE` launches) did not improve the best by more than the noise, when
  proposals keep landing on measured behaviours, or at the budget.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
import zlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pdtop.engine.errors import ConfigError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.tune.score import Measurement, Slo, itl_kind
from pdtop.tune.space import restart_key

if TYPE_CHECKING:
    import optuna

    from pdtop.tune.space import Params, TuneSpace

STARTUP = 14  # trials TPE samples at random before it models them (after the start points)
FREEZE_AFTER = 10  # measured trials with a knob, at 3 SM layouts or more, before its effect is judged
PATIENCE = 30  # measured candidates without a gain beyond the noise, past the random start: stop
DUPLICATES = 60  # proposals in a row that land on measured behaviours: stop
EXPLORE_AFTER = 5  # proposals in a row of measured behaviours: the next ones are drawn at random
LIVE_DUPLICATES = 8  # the same, on a running server's layout: relaunch
INNER_STARTUP = 3  # trials a layout's own study samples at random
LIVE_TRIALS = 5  # proposals in a row on one running server before its restart knobs are freed
LAUNCH_PATIENCE = 8  # and, where candidates start servers, servers started without a gain: stop
NEAR = 3  # configurations measured again near the best (noisy devices)
NOISE_MULT = 3.0  # an effect up to this many times the spread of a repeat is within the noise
NOISE_FLOOR = 0.03  # on a noisy device, and at least this share of the score (one repeat is a rough estimate)
FAILED_SCORE = -1e6  # a candidate that could not be measured (a server that did not start)


# ---- trials and the front ---------------------------------------------------------------------

@dataclass
class Trial:
    """A measured behaviour: the configuration shown for it, its figures (the mean of its measurements)."""

    config: PdmuxConfig
    result: Measurement
    params: Params | None = None  # its point in the space (None: outside every family)
    measurements: list[Measurement] = field(default_factory=list)
    order: int = 0  # when it was first measured (0: first)

    def __post_init__(self) -> None:
        if not self.measurements:
            self.measurements = [self.result]


def _itl(t: Trial) -> float:
    return math.inf if math.isnan(t.result.itl_p99_s) else t.result.itl_p99_s


def _tok_s(t: Trial) -> float:
    return -math.inf if math.isnan(t.result.prefill_tok_s) else t.result.prefill_tok_s


def pareto_front(trials: Iterable[Trial]) -> list[Trial]:
    """The trials no other beats on both ITL p99 (lower) and prefill throughput (higher), by ITL."""
    front: list[Trial] = []
    for t in sorted(trials, key=lambda t: (_itl(t), -_tok_s(t))):
        if not front or _tok_s(t) > _tok_s(front[-1]):
            front.append(t)
    return front


def best_trial(trials: Iterable[Trial], slo: Slo) -> Trial | None:
    """The best goodput among the trials that meet the SLOs (then prefill throughput, then ITL)."""
    meeting = [t for t in trials if slo.met(t.result)]
    good = [t for t in meeting if not math.isnan(t.result.goodput_rps)]
    return max(good or meeting, key=lambda t: (t.result.goodput_rps if good else 0.0, _tok_s(t), -_itl(t)),
               default=None)


def closest_trials(trials: Iterable[Trial], slo: Slo, n: int = 3) -> list[Trial]:
    """The `n` trials nearest to meeting the SLOs."""
    return sorted(trials, key=lambda t: (slo.excess(t.result), -_tok_s(t)))[:n]


def score(m: Measurement, slo: Slo) -> float:
    """What the sampler maximizes: goodput when the SLOs are met (prefill throughput breaks ties), else
    minus 1 and how far each SLO is missed (measured / target - 1, summed: each one missed shows), so every
    configuration that meets them ranks above every one that does not, and the closer a miss, the better."""
    if math.isnan(m.itl_p99_s) and math.isnan(m.goodput_rps):
        return FAILED_SCORE
    if slo.met(m):
        tok_s = 0.0 if math.isnan(m.prefill_tok_s) else m.prefill_tok_s
        return (0.0 if math.isnan(m.goodput_rps) else m.goodput_rps) + tok_s * 1e-9
    ratios = [m.itl_p99_s / slo.itl_s] + ([m.ttft_p99_s / slo.ttft_s] if slo.ttft_s else [])
    missed = sum(max(0.0, r - 1) if not math.isnan(r) else math.inf for r in ratios)
    return -min(1 + missed, -FAILED_SCORE / 2)


def spread(ms: list[Measurement], slo: Slo) -> tuple[float, float]:
    """The spread of the score between repeats of one configuration where they are comparable: (among those
    meeting the SLOs: goodput, among those missing them: how far); failed ones left out."""
    scores = [score(m, slo) for m in ms if score(m, slo) > FAILED_SCORE]
    met, missed = [s for s in scores if s >= 0], [s for s in scores if s < 0]
    return (max(met) - min(met) if len(met) > 1 else 0.0, max(missed) - min(missed) if len(missed) > 1 else 0.0)


def mean(ms: list[Measurement]) -> Measurement:
    """Each figure's mean over the measurements (NaN where none has one)."""
    def avg(name: str) -> float:
        values = [getattr(m, name) for m in ms if not math.isnan(getattr(m, name))]
        return statistics.fmean(values) if values else math.nan

    first = ms[0]
    return dataclasses.replace(first, itl_p99_s=avg("itl_p99_s"), ttft_p99_s=avg("ttft_p99_s"),
                               prefill_tok_s=avg("prefill_tok_s"), goodput_rps=avg("goodput_rps"),
                               good=round(statistics.fmean(m.good for m in ms)), itl_from=itl_kind(ms))


# ---- the search -------------------------------------------------------------------------------

@dataclass
class Candidate:
    trial: optuna.trial.Trial | None  # the main study's (None: proposed by a layout's own study)
    params: Params
    config: PdmuxConfig
    key: Hashable
    inner: optuna.trial.Trial | None = None  # the layout's study's, for a live candidate


@dataclass
class Effect:
    """What one knob did: the spread of the score between its values, and whether it was fixed."""

    knob: str
    effect: float  # max - min over the groups of trials by its value (score units: goodput when SLOs are met)
    values: int  # distinct values tried
    fixed: Any = None  # the value it was fixed at (its effect within the noise), None while it varies
    within_noise: bool = True  # the effect is no larger than the noise allows


class AdaptiveSearch:
    """TPE over a `TuneSpace`: `ask(fixed)` a candidate (None: nothing new to try), `tell` its measurement;
    `record` a measurement made otherwise (start points, reused outcomes). `storage` (an Optuna storage,
    e.g. a journal file) keeps the study, so a run with the same name goes on where one stopped."""

    def __init__(self, space: TuneSpace, slo: Slo, seed: int = 0, storage: optuna.storages.BaseStorage | None = None,
                 study_name: str = "pdtop-tune", patience: int = PATIENCE):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=STARTUP, constant_liar=False)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self.study = optuna.create_study(direction="maximize", sampler=self.sampler, storage=storage,
                                         study_name=study_name, load_if_exists=True)
        self.space, self.slo, self.patience, self.seed = space, slo, patience, seed
        self.trials: dict[Hashable, Trial] = {}
        self.frozen: dict[str, Any] = {}  # knob -> the value it is fixed at
        # the largest spread of score between repeated measurements, among those meeting the SLOs (goodput/s)
        # and among those missing them (the worst SLO ratio): the two scales are not comparable
        self.noise_met, self.noise_missed = 0.0, 0.0
        self.duplicates = 0  # proposals in a row that landed on measured behaviours
        self.since_best = 0  # measured candidates since the best score last rose by more than the noise
        self._best_score = -math.inf
        self._inner: dict[tuple[Any, ...], tuple[optuna.Study, set[Hashable]]] = {}  # per SM layout: its study
        self._load()

    # -- the study ----------------------------------------------------------------------------

    def _distributions(self, params: Params) -> dict[str, optuna.distributions.BaseDistribution]:
        import optuna.distributions as d

        knobs = self.space.knobs()
        families = [f.name for f in self.space.families]
        out: dict[str, d.BaseDistribution] = {"levels": d.CategoricalDistribution(families)}
        for name in params:
            if name != "levels":
                k = knobs[name]
                out[name] = (d.CategoricalDistribution(list(k.choices)) if k.choices else
                             d.IntDistribution(k.low, k.high, log=k.log, step=1 if k.log else k.step))
        return out

    def _suggest(self, trial: optuna.trial.Trial) -> Params:
        fam = self.space.family(trial.suggest_categorical("levels", [f.name for f in self.space.families]))
        params: Params = {"levels": fam.name}
        for k in fam.knobs:
            params[k.name] = (trial.suggest_categorical(k.name, list(k.choices)) if k.choices else
                              trial.suggest_int(k.name, k.low, k.high, log=k.log, step=1 if k.log else k.step))
        return params

    def _load(self) -> None:
        """The measurements of a study stored before (a resumed run)."""
        import optuna

        for ft in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            attrs = ft.user_attrs
            if "config" in attrs and "result" in attrs:
                self._keep(PdmuxConfig(**attrs["config"]), Measurement(**attrs["result"]), dict(ft.params) or None)

    def _attrs(self, config: PdmuxConfig, m: Measurement) -> dict[str, Any]:
        return {"config": config.to_dict(), "result": dataclasses.asdict(m)}

    # -- what was measured --------------------------------------------------------------------

    def measured(self, config: PdmuxConfig) -> Trial | None:
        """The trial of `config`'s behaviour, if it was measured."""
        try:
            return self.trials.get(self.space.key(config))
        except ConfigError:
            return None

    def _keep(self, config: PdmuxConfig, m: Measurement, params: Params | None) -> Trial:
        key = self.space.key(config)
        trial = self.trials.get(key)
        if trial is None:
            trial = self.trials[key] = Trial(config, m, params, order=len(self.trials))
        else:
            trial.measurements.append(m)
            trial.result = mean(trial.measurements)
            met, missed = spread(trial.measurements, self.slo)
            self.noise_met, self.noise_missed = max(self.noise_met, met), max(self.noise_missed, missed)
        return trial

    def _progressed(self, trial: Trial) -> None:
        s = score(trial.result, self.slo)
        if s > self._best_score + self.noise_at(self._best_score) or len(self.trials) <= STARTUP:
            self.since_best = 0
        else:
            self.since_best += 1
        self._best_score = max(self._best_score, s)
        self._update_frozen()

    def record(self, config: PdmuxConfig, m: Measurement) -> Trial:
        """A measurement made outside `ask` (a start point, a repeat, an outcome reused): kept, and told to
        the study where the configuration is a point of the space."""
        import optuna

        params = self.space.params(config)
        repeat = self.measured(config) is not None
        trial = self._keep(config, m, params)
        if params is not None:
            self.study.add_trial(optuna.trial.create_trial(
                params=params, distributions=self._distributions(params), value=score(m, self.slo),
                user_attrs=self._attrs(config, m)))
        if not repeat:
            self._progressed(trial)
        return trial

    def ask(self, max_duplicates: int = DUPLICATES) -> Candidate | None:
        """A configuration whose behaviour was not measured, the frozen knobs held; None when
        `max_duplicates` proposals in a row were of measured behaviours."""
        import optuna

        fixed = dict(self.frozen)
        streak = 0
        try:
            while streak < max_duplicates:
                # TPE keeps proposing what it knows near the best; past a few of those, draw at random
                base = self.sampler if streak < EXPLORE_AFTER else self._random
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    self.study.sampler = optuna.samplers.PartialFixedSampler(fixed, base) if fixed else base
                trial = self.study.ask()
                params = self._suggest(trial)
                try:
                    config = self.space.config(params)
                    key = self.space.key(config)
                except ConfigError:  # a division the device cannot make
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                known = self.trials.get(key)
                if known is None:
                    self.duplicates = 0
                    return Candidate(trial, params, config, key)
                trial.set_user_attr("duplicate", True)  # not a new observation: the sampler leaves it out
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                streak += 1
                self.duplicates += 1
            return None
        finally:
            self.study.sampler = self.sampler

    def ask_live(self, running: PdmuxConfig, max_duplicates: int = LIVE_DUPLICATES) -> Candidate | None:
        """A configuration with `running`'s SM layout (what a running server can be set to live), from that
        layout's own study over the knobs that need no restart, fed every trial measured on the layout: a
        one- or two-knob search converges in a few trials where the whole space's would sample them blind.
        None when the layout has nothing new to offer."""
        import optuna

        restart = self.space.restart_params(running)
        if "levels" not in restart:
            return None
        fam = self.space.family(restart["levels"])
        live = [k for k in fam.knobs if not k.restart and k.name not in self.frozen]
        if not live:
            return None
        layout = tuple(sorted(restart.items()))
        if layout not in self._inner:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.TPESampler(seed=zlib.crc32(repr(layout).encode()) ^ self.seed,
                                                     multivariate=True, n_startup_trials=INNER_STARTUP,
                                                     constant_liar=False)
            self._inner[layout] = (optuna.create_study(direction="maximize", sampler=sampler), set())
        inner, fed = self._inner[layout]
        for key, t in self.trials.items():  # what was measured on this layout, however it was proposed
            if key not in fed and t.params and all(t.params.get(k) == v for k, v in restart.items()):
                fed.add(key)
                inner.add_trial(optuna.trial.create_trial(
                    params={k.name: t.params[k.name] for k in live},
                    distributions={k.name: self._distributions({k.name: 0})[k.name] for k in live},
                    value=score(t.result, self.slo)))
        for _ in range(max_duplicates):
            trial = inner.ask()
            params = {**restart, **{k: v for k, v in self.frozen.items() if k in {x.name for x in fam.knobs}}}
            for k in live:
                params[k.name] = (trial.suggest_categorical(k.name, list(k.choices)) if k.choices else
                                  trial.suggest_int(k.name, k.low, k.high, log=k.log, step=1 if k.log else k.step))
            try:
                config = self.space.config(params)
                key = self.space.key(config)
            except ConfigError:
                inner.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if key not in self.trials:
                fed.add(key)
                return Candidate(None, params, config, key, trial)
            inner.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None

    def tell(self, cand: Candidate, m: Measurement) -> Trial:
        import optuna

        value = score(m, self.slo)
        if cand.trial is not None:
            for name, attr in self._attrs(cand.config, m).items():
                cand.trial.set_user_attr(name, attr)
            self.study.tell(cand.trial, value)
        else:
            self.study.add_trial(optuna.trial.create_trial(
                params=cand.params, distributions=self._distributions(cand.params), value=value,
                user_attrs=self._attrs(cand.config, m)))
        if cand.inner is not None:
            layout = next(v for v in self._inner.values() if v[0] is cand.inner.study)
            layout[0].tell(cand.inner, value)
        trial = self._keep(cand.config, m, cand.params)
        self._progressed(trial)
        return trial

    # -- what it learned ----------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        """Each knob's effect: the trials grouped by its value (up to three groups of neighbouring values),
        the spread of the groups' median score."""
        knobs = self.space.knobs()
        out = []
        for name in ["levels", *knobs]:
            pairs = sorted((t.params[name], score(t.result, self.slo)) for t in self.trials.values()
                           if t.params is not None and name in t.params and score(t.result, self.slo) > FAILED_SCORE)
            values = sorted({v for v, _ in pairs}, key=str)
            if len(values) < 2:
                out.append(Effect(name, 0.0, len(values), self.frozen.get(name)))
                continue
            if name == "levels" or knobs[name].choices:
                groups = [[s for v, s in pairs if v == value] for value in values]
            else:
                n = len(pairs)
                groups = [[s for _, s in pairs[i * n // 3:(i + 1) * n // 3]] for i in range(3)]
            medians = [statistics.median(g) for g in groups if g]
            effect = max(medians) - min(medians)
            out.append(Effect(name, effect, len(values), self.frozen.get(name), self.within_noise(medians)))
        return out

    def _update_frozen(self) -> None:
        best = max((t for t in self.trials.values() if t.params is not None),
                   key=lambda t: score(t.result, self.slo), default=None)
        if best is None or best.params is None:
            return
        knobs = self.space.knobs()
        for e in self.effects():
            if e.knob in self.frozen or e.knob not in best.params:
                continue
            choices = len(self.space.families) if e.knob == "levels" else knobs[e.knob].count
            having = [t for t in self.trials.values() if t.params and e.knob in t.params]
            layouts = len({restart_key(t.config) for t in having})
            # the knob's effect is at most the spread of every trial that has it: within the noise, it
            # cannot matter (grouped by its value, other knobs could hide what it does)
            flat = bool(having) and self.within_noise([score(t.result, self.slo) for t in having])
            if choices < 2 or (len(having) >= FREEZE_AFTER and layouts >= 3 and e.values >= min(3, choices) and flat):
                self.frozen[e.knob] = best.params[e.knob]

    @property
    def noise(self) -> float:
        """The noise where it matters most: among configurations meeting the SLOs once one does."""
        return self.noise_at(self._best_score)

    def noise_at(self, level: float) -> float:
        return self.noise_met if level >= 0 else self.noise_missed

    def within_noise(self, scores: list[float]) -> bool:
        """Scores (of groups of trials) no further apart than the noise allows, on one side of the SLOs (a
        spread of two repeats is a rough estimate of the noise: up to `NOISE_MULT` times it, and on a
        noisy device at least `NOISE_FLOOR` of the score)."""
        if min(scores) < 0 <= max(scores):
            return False
        noise = self.noise_at(min(scores))
        floor = NOISE_FLOOR * max(abs(x) for x in scores) if noise > 0 else 0.0
        return max(scores) - min(scores) <= NOISE_MULT * noise + floor + 1e-12

    @property
    def all_frozen(self) -> bool:
        best = self.best
        keys = (best.params or {}).keys() if best is not None else ["levels"]
        return bool(self.trials) and all(k in self.frozen for k in keys)

    def nothing_mattered(self) -> bool:
        """Every knob was fixed because its effect was within the noise (none was ever seen to matter)."""
        return self.flat() or (self.all_frozen and all(e.within_noise for e in self.effects()))

    def flat(self) -> bool:
        """Every measured trial within the noise of the others, over enough trials and SM layouts to tell:
        whatever the knobs, the figures are the same."""
        scored = [t for t in self.trials.values() if score(t.result, self.slo) > FAILED_SCORE]
        return (len(scored) >= FREEZE_AFTER and len({restart_key(t.config) for t in scored}) >= 3
                and self.within_noise([score(t.result, self.slo) for t in scored]))

    def stop_reason(self) -> str | None:
        if self.flat():
            return "no knob matters"
        if self.all_frozen:
            return "no knob matters" if self.nothing_mattered() else "every knob settled"
        if self.duplicates >= DUPLICATES:
            return "nothing new to try"
        return None

    @property
    def front(self) -> list[Trial]:
        return pareto_front(self.trials.values())

    @property
    def best(self) -> Trial | None:
        return best_trial(self.trials.values(), self.slo)

    def near_best(self, n: int = NEAR) -> list[Trial]:
        """The best and the trials whose score is within the noise of it, measured once only."""
        best = self.best
        if best is None:
            return []
        top = score(best.result, self.slo)
        near = [t for t in self.trials.values() if score(t.result, self.slo) >= top - self.noise]
        return sorted((t for t in near if len(t.measurements) == 1), key=lambda t: -score(t.result, self.slo))[:n]


# ---- the driver -------------------------------------------------------------------------------

class Runner(Protocol):
    """Measures candidates: pdtop's engine, or servers launched per candidate."""

    deterministic: bool  # measuring twice gives the same figures (sim:): no noise to learn, no repeats
    launches: int  # servers started so far (0 where a candidate costs no start)

    def live(self) -> PdmuxConfig | None:
        """The configuration of a running server whose live knobs can be changed, else None."""

    def fits(self, live: bool) -> bool:
        """Another candidate fits the budget (`live`: one set on the running server, no start)."""

    def measure(self, config: PdmuxConfig, repeat: int) -> Measurement:
        """`config`'s figures (`repeat`: how many times it was measured before)."""


@dataclass
class SearchRun:
    measured: int  # measurements (candidates and repeats)
    launches: int  # servers started
    elapsed_s: float
    complete: bool  # False: the budget ran out first
    stop: str  # why it stopped
    noise: float = 0.0  # in score units (goodput/s where the SLOs are met)
    effects: list[Effect] = field(default_factory=list)
    first_meeting: int | None = None  # launches (or measurements, without launches) to the first meeting the SLOs


def run_search(search: AdaptiveSearch, runner: Runner, default: PdmuxConfig, guess: PdmuxConfig | None = None,
               progress: Callable[[Trial, Measurement], None] | None = None, live_trials: int | None = None,
               clock: Callable[[], float] = time.monotonic) -> SearchRun:
    """Measure SGLang's default (twice on a noisy runner), the guess, then what the search asks for until it
    stops or the runner's budget is spent; then repeat what is near the best on a noisy runner."""
    t0, measured = clock(), 0
    first: int | None = None
    live_trials = LIVE_TRIALS if live_trials is None else live_trials

    def measure(config: PdmuxConfig, cand: Candidate | None = None) -> Trial:
        nonlocal measured, first
        known = search.measured(config)
        repeat = 0 if known is None or cand is not None else len(known.measurements)
        m = runner.measure(config, repeat)
        measured += 1
        trial = search.tell(cand, m) if cand is not None else search.record(config, m)
        if first is None and search.slo.met(m):
            first = runner.launches or measured
        if progress is not None:
            progress(trial, m)
        return trial

    def have(config: PdmuxConfig, times: int) -> bool:
        known = search.measured(config)
        return known is not None and len(known.measurements) >= times

    if not have(default, 1):
        measure(default)
    if not runner.deterministic and not have(default, 2) and runner.fits(runner.live() is not None):
        measure(default)  # the noise
    if guess is not None and not have(guess, 1) and runner.fits(False):
        measure(guess)
    stop, streak, launches = "", 0, runner.launches
    launches_at_best = runner.launches
    while not stop:
        running = runner.live()
        on_server = running is not None and streak < live_trials and runner.fits(True)
        if not on_server and not runner.fits(False):
            stop = "budget"
            break
        if search.since_best == 0:
            launches_at_best = runner.launches
        stop = search.stop_reason() or ""
        if not stop and search.since_best >= search.patience and (
                runner.launches == 0 or runner.launches - launches_at_best >= LAUNCH_PATIENCE):
            stop = f"no gain beyond the noise in {search.since_best} candidates" + (
                f" and {runner.launches - launches_at_best} launches" if runner.launches else "")
        if stop:
            break
        cand = search.ask_live(running) if on_server and running is not None else search.ask()
        if cand is None:
            if on_server:
                streak = live_trials  # nothing new on this server: free its restart knobs
                continue
            stop = "nothing new to try"
            break
        measure(cand.config, cand)
        streak = streak + 1 if runner.launches == launches else 0
        launches = runner.launches
    if not runner.deterministic:
        for t in search.near_best():
            running = runner.live()
            if runner.fits(running is not None and restart_key(running) == restart_key(t.config)):
                measure(t.config)
    first_meeting = first if first is not None else None
    return SearchRun(measured, runner.launches, clock() - t0, stop != "budget", stop, search.noise, search.effects(),
                     first_meeting)
