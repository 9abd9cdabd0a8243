"""The ways compared under the SLOs on the same workload (`pdtop tune --policies pdmux,chunked,disagg`).

Each policy gets its best configuration, found on `pdtop tune`'s scenario and measured the same
way (`engine_search.measure`): pdmux by tune's own search over SGLang's knobs; chunked over its
chunk size; prefill-first and disagg (1P1D over the engine's link) have nothing to tune and are
measured once. Reported per policy: the best configuration that meets the SLOs (else the closest),
its figures, the devices it used and goodput per device, so disagg's second GPU is charged.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdtop.bench.policy_bench import Scenario, check_fits
from pdtop.engine.engine import Engine
from pdtop.engine.errors import EngineError
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.tune.engine_search import measure, tune
from pdtop.tune.report import describe_config
from pdtop.tune.score import Measurement, Slo

CHUNK_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
TUNABLE = ("pdmux", "chunked", "prefill-first", "disagg")


@dataclass
class PolicyBest:
    policy: str
    config: str  # the best configuration, in words
    result: Measurement
    devices: int  # disagg: 2
    meets: bool  # the SLOs
    tried: int  # configurations measured

    @property
    def goodput_per_device(self) -> float:
        return self.result.goodput_rps / self.devices


def parse_policies(text: str) -> list[str]:
    """`pdmux,chunked,disagg` -> the list; ValueError naming what is not a policy tune compares."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in TUNABLE]
    if not names or bad:
        raise ValueError(f"--policies takes a comma-separated list of {', '.join(TUNABLE)}, got {text!r}")
    return list(dict.fromkeys(names))


def _rank(m: Measurement, slo: Slo) -> tuple[bool, float, float]:
    good = 0.0 if math.isnan(m.goodput_rps) else m.goodput_rps
    return slo.met(m), good if slo.met(m) else -slo.excess(m), -m.itl_p99_s


def compare(make_engine: Callable[[str], Engine], sc: Scenario, slo: Slo, policies: list[str], link: str,
            budget_s: float = math.inf, progress: Callable[[str], None] | None = None) -> list[PolicyBest]:
    """The best of each policy; `make_engine(policy)` builds a fresh engine (disagg's with its link, named
    `link`). The budget is shared out: pdmux's search gets its part of what is left."""
    say = progress or (lambda _: None)
    t0 = time.monotonic()
    out: list[PolicyBest] = []
    for policy in policies:
        left = budget_s - (time.monotonic() - t0)
        if policy == "pdmux":
            report = tune(lambda: make_engine("pdmux"), sc, slo, max(0.0, left) / max(1, len(policies) - len(out)))
            trial = report.best or (report.closest[0] if report.closest else report.default)
            out.append(PolicyBest(policy, describe_config(trial.config), trial.result, 1, report.best is not None,
                                  report.run.measured))
        else:
            candidates = [PdmuxConfig(chunk_size=c) for c in CHUNK_SIZES] if policy == "chunked" else [PdmuxConfig()]
            measured: list[tuple[PdmuxConfig, Measurement]] = []
            for config in candidates:
                if measured and time.monotonic() - t0 > budget_s:
                    break
                engine = make_engine(policy)
                try:
                    check_fits(engine, sc)
                    measured.append((config, measure(engine, sc, slo, config, policy=policy)))
                finally:
                    engine.close()
            config, best = max(measured, key=lambda cm: _rank(cm[1], slo))
            words = {"chunked": f"chunk_size={config.chunk_size}", "disagg": f"1P1D over {link}"}
            out.append(PolicyBest(policy, words.get(policy, "-"), best, 2 if policy == "disagg" else 1,
                                  slo.met(best), len(measured)))
        b = out[-1]
        say(f"{policy}: {b.config}: goodput {b.result.goodput_rps:.2f}/s on {b.devices} device(s)")
    if not out:
        raise EngineError("no policy to compare")
    return out


def table(rows: list[PolicyBest], slo: Slo) -> list[str]:
    ttft = f", TTFT p99 <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    lines = [f"{'policy':<14}{'ITL p99':>9}{'TTFT p99':>10}{'goodput':>9}{'devices':>8}{'per device':>11}"
             f"{'meets':>7}  best configuration"]
    for b in sorted(rows, key=lambda b: (b.meets, b.goodput_per_device), reverse=True):
        r = b.result
        lines.append(f"{b.policy:<14}{r.itl_p99_s * 1e3:>9.2f}{r.ttft_p99_s * 1e3:>10.0f}{r.goodput_rps:>9.2f}"
                     f"{b.devices:>8}{b.goodput_per_device:>11.2f}{'yes' if b.meets else 'no':>7}  {b.config}")
    lines.append(f"ms; goodput: requests/s that met every SLO (ITL p99 <= {slo.itl_s * 1e3:g} ms{ttft}); per device: "
                 "goodput / devices used (disagg runs on 2)")
    return lines


def to_json(rows: list[PolicyBest]) -> list[dict[str, object]]:
    return [{"policy": b.policy, "config": b.config, "devices": b.devices, "meets_slo": b.meets, "tried": b.tried,
             "itl_p99_ms": b.result.itl_p99_s * 1e3, "ttft_p99_ms": b.result.ttft_p99_s * 1e3,
             "goodput_rps": b.result.goodput_rps, "goodput_rps_per_device": b.goodput_per_device} for b in rows]
