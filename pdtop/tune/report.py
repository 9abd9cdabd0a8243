"""What a `pdtop tune` search found (`TuneReport`) and how it is printed: the candidates measured, which
knobs mattered, the Pareto front as a table and a text plot, the chosen configuration against SGLang's
default, the same as one JSON object, and the chosen configuration as the YAML the target SGLang reads."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdtop import format as fmt
from pdtop.engine.scheduling.pdmux_config import (
    SGLANG_KEYS,
    SGLANG_MAIN,
    SGLANG_MAIN_NAME,
    SGLANG_RELEASE,
    PdmuxConfig,
    dump_pdmux_config,
)
from pdtop.tune.score import Slo
from pdtop.tune.search import SearchRun, Trial, score
from pdtop.tune.sglang_server import rules_line

if TYPE_CHECKING:
    from pdtop.bench.policy_bench import Scenario
    from pdtop.tune.space import TuneSpace


@dataclass
class TuneReport:
    slo: Slo
    scenario: Scenario
    default: Trial  # SGLang's default configuration on the same workload
    trials: list[Trial]  # every behaviour measured
    front: list[Trial]
    best: Trial | None  # best goodput among those that meet the SLOs
    closest: list[Trial]  # nearest to the SLOs (when none meets them)
    run: SearchRun
    space: TuneSpace

    @property
    def grid_size(self) -> int:
        return self.space.size


def describe_config(config: PdmuxConfig) -> str:
    """The knobs that pick a split, and the budget: `sm_group_num=3 decode_bs_divisor=32 budget=147456`."""
    if config.manual_divisions:
        split = f"manual_divisions={config.manual_divisions}"
    else:
        split = f"sm_group_num={config.sm_group_num} decode_bs_divisor={config.decode_bs_divisor}"
    if config.overlap_decode_full_sm:
        split += " overlap_decode_full_sm"
    cap = f" max_layers={config.max_split_forward_layers}" if config.max_split_forward_layers else ""
    return f"{split} budget={config.split_forward_token_budget}{cap}"


def sglang_name(sglang: str) -> str:
    return SGLANG_MAIN_NAME if sglang == SGLANG_MAIN else f"SGLang {SGLANG_RELEASE}"


ENGINE_WINDOW = ("over tune's window, which the SLO is held against; pdtop bench --config runs the decode "
                 "requests longer before the long prompts and reads a little higher (docs/tune.md)")


def best_yaml(report: TuneReport, device: str, kind: str, itl: str = "ITL p99", window: str = ENGINE_WINDOW) -> str:
    """The chosen configuration as the YAML the target SGLang reads, as it was measured: a budget left to
    the device is written as the device's (4,096 on cpu), so feeding the file back runs what was measured.
    The header says which SGLang reads it with the meaning it was measured with, what that SGLang's
    server refuses beside `--enable-pdmux`, and over which window the figures were measured."""
    assert report.best is not None
    r, slo, sglang = report.best.result, report.slo, report.space.sglang
    ttft = f", TTFT p99 <= {slo.ttft_s * 1e3:g} ms" if slo.ttft_s else ""
    comment = (f"pdtop tune on {device}: SLO {itl} <= {slo.itl_s * 1e3:g} ms{ttft}\n"
               f"measured: {itl} {r.itl_p99_s * 1e3:.2f} ms, TTFT p99 {r.ttft_p99_s * 1e3:.0f} ms, "
               f"prefill {r.prefill_tok_s:.0f} tok/s, goodput {r.goodput_rps:.2f} req/s\n"
               f"  {window}\n"
               f"for {sglang_name(sglang)}: it reads these keys as pdtop measured them"
               + (" (SGLang 0.5.23 would skip max_split_forward_layers and overlap_decode_full_sm)"
                  if sglang == SGLANG_MAIN else "") + "\n"
               f"{rules_line(sglang)}\n"
               "SGLang: --enable-pdmux --pdmux-config-path FILE; pdtop: pdtop --config FILE")
    return dump_pdmux_config(report.best.config.for_device(kind), comment, sglang)


def trial_table(trials: list[Trial], slo: Slo, marks: dict[int, str] | None = None, itl: str = "ITL p99"
                ) -> list[str]:
    """One row per trial: ITL p99, TTFT p99, prefill tokens/s, goodput, whether it meets the SLOs."""
    marks, w = marks or {}, max(9, len(itl))
    lines = [f"  {itl:>{w}} {'TTFT p99':>9} {'prefill tok/s':>14} {'goodput':>9}  {'SLO':<4} configuration"]
    for t in trials:
        r = t.result
        mark = marks.get(id(t), "")
        lines.append(f"{mark:<2}{fmt.ms(r.itl_p99_s):>{w}} {fmt.duration(r.ttft_p99_s):>9} "
                     f"{fmt.count(r.prefill_tok_s):>14} {fmt.per_s(r.goodput_rps):>9}  "
                     f"{'yes' if slo.met(r) else 'no':<4} {describe_config(t.config)}")
    return lines


CANDIDATE_ROWS = 30  # candidates listed in the text; more: the best ones (every one is in --json)


def candidate_table(report: TuneReport, itl: str = "ITL p99") -> list[str]:
    """Every candidate in the order measured (the best `CANDIDATE_ROWS` by score when there are more),
    with how many times each was measured."""
    trials, slo = report.trials, report.slo
    shown = trials if len(trials) <= CANDIDATE_ROWS else sorted(
        sorted(trials, key=lambda t: -score(t.result, slo))[:CANDIDATE_ROWS], key=lambda t: t.order)
    head = (f"candidates, in the order measured ({len(trials)})" if shown is trials else
            f"the best {len(shown)} of {len(trials)} candidates, in the order measured (all in --json)")
    marks = {id(report.default): "D"} | ({id(report.best): "*"} if report.best is not None else {})
    rows = trial_table(shown, slo, marks, itl)
    return [head, rows[0] + "  (xN: measured N times, figures their mean)",
            *(row + (f"  x{len(t.measurements)}" if len(t.measurements) > 1 else "")
              for row, t in zip(rows[1:], shown, strict=True))]


def learned(report: TuneReport) -> list[str]:
    """Which knobs mattered: each knob's effect (the spread of the score between its values: goodput/s
    where the SLOs are met, else how far they are missed) against the noise, and why the search stopped."""
    run = report.run
    noise = f"noise {run.noise:.3g}" if run.noise else "no noise (a deterministic device)"
    lines = [f"what mattered (score: goodput/s where the SLOs are met, else minus the worst SLO ratio; {noise}):"]
    for e in run.effects:
        if e.values < 2:
            state = "one value" if e.fixed is not None else "not tried"
        elif e.fixed is not None and e.within_noise:
            state = f"within the noise: fixed at {e.fixed}"
        else:
            state = "within the noise so far" if e.within_noise else "mattered"
        lines.append(f"  {e.knob:<26} effect {e.effect:>8.3f}  over {e.values:>3} values  {state}")
    stop = "the budget ran out" if run.stop == "budget" else run.stop
    first = f"; first meeting the SLOs after {run.first_meeting}" if run.first_meeting else ""
    lines.append(f"stopped: {stop}{first}")
    if run.stop == "no knob matters":
        lines.append("no knob changed the figures by more than the noise: SGLang's default is as good as any")
    return lines + report.space.notes


def front_plot(report: TuneReport, width: int = 64, height: int = 14, itl: str = "ITL p99") -> list[str]:
    """ITL p99 (up) against prefill tokens/s (right): `o` the front, `.` other measured configurations,
    `D` SGLang's default, `*` the chosen one; the dashed row is the ITL SLO. ITLs above twice the SLO
    are drawn on the top row, whose label then reads `≥` and a line under the plot says how many."""
    trials = [t for t in report.trials if not math.isnan(t.result.itl_p99_s + t.result.prefill_tok_s)]
    if not trials:
        return []
    slo_ms = report.slo.itl_s * 1e3
    xs = [t.result.prefill_tok_s for t in trials]
    ys = [t.result.itl_p99_s * 1e3 for t in trials] + [slo_ms]
    x0, x1, y0 = min(xs), max(xs), min(ys)
    y1 = min(max(ys), 2 * slo_ms)
    grid = [[" "] * width for _ in range(height)]

    def cell(x: float, y: float) -> tuple[int, int]:
        col = round((x - x0) / (x1 - x0) * (width - 1)) if x1 > x0 else width // 2
        row = round((y1 - min(y, y1)) / (y1 - y0) * (height - 1)) if y1 > y0 else height // 2
        return row, col

    slo_row = cell(x0, slo_ms)[0]
    grid[slo_row] = ["╌"] * width
    front = {id(t) for t in report.front}
    layers = [(t, "o" if id(t) in front else ".") for t in trials]
    layers += [(report.default, "D")] + ([(report.best, "*")] if report.best is not None else [])
    for t, mark in sorted(layers, key=lambda tm: ".oD*".index(tm[1])):  # stronger marks drawn last
        if not math.isnan(t.result.itl_p99_s + t.result.prefill_tok_s):
            row, col = cell(t.result.prefill_tok_s, t.result.itl_p99_s * 1e3)
            grid[row][col] = mark
    label = 11
    above = [y for y in ys if y > y1]  # drawn on the top row, not at their height
    top = f"≥ {fmt.ms(y1 / 1e3)}" if above else fmt.ms(y1 / 1e3)
    lines = [itl]
    labels = {0: top, height - 1: fmt.ms(y0 / 1e3), slo_row: f"SLO {fmt.ms(slo_ms / 1e3)}"}
    for i, cells in enumerate(grid):
        text = labels.get(i, "")
        lines.append(f"{text:>{label - 1}} │{''.join(cells)}")
    lines.append(" " * label + "└" + "─" * width)
    left, right = fmt.count(x0), f"{fmt.count(x1)} prefill tok/s"
    lines.append(" " * (label + 1) + left + right.rjust(width - len(left)))
    lines.append(" " * (label + 1) + "o front   . measured   D SGLang default   * chosen   ╌ ITL SLO")
    if above:
        lines.append(" " * (label + 1) + f"{len(above)} of {len(trials)} configurations above {fmt.ms(y1 / 1e3)} "
                                         f"(up to {fmt.ms(max(above) / 1e3)}) are drawn on the top row")
    return lines


def comparison(report: TuneReport, itl: str = "ITL p99") -> list[str]:
    """The chosen configuration against SGLang's default, with the ratio of each figure."""
    assert report.best is not None
    rows = [("SGLang default", report.default.result), ("chosen", report.best.result)]
    w = max(10, len(itl) + 1)
    lines = [f"{'':<16}{itl:>{w}}{'TTFT p99':>10}{'prefill tok/s':>15}{'goodput':>10}"]
    for name, r in rows:
        lines.append(f"{name:<16}{fmt.ms(r.itl_p99_s):>{w}}{fmt.duration(r.ttft_p99_s):>10}"
                     f"{fmt.count(r.prefill_tok_s):>15}{fmt.per_s(r.goodput_rps):>10}")
    d, b = report.default.result, report.best.result
    ratios = [ratio(b.itl_p99_s, d.itl_p99_s), ratio(b.ttft_p99_s, d.ttft_p99_s),
              ratio(b.prefill_tok_s, d.prefill_tok_s), ratio(b.goodput_rps, d.goodput_rps)]
    lines.append(f"{'chosen/default':<16}{ratios[0]:>{w}}{ratios[1]:>10}{ratios[2]:>15}{ratios[3]:>10}")
    return lines


def front_and_choice(report: TuneReport, out: str | None, itl: str = "ITL p99", notes: list[str] | None = None,
                     kept_default: bool = False) -> list[str]:
    """The text under a tune command's header: the front as a table and a plot, `notes` (failed launches),
    then the chosen configuration against SGLang's default and the file written to `out`, or the closest
    configurations when none meets the SLOs. `kept_default`: the best was within the noise of the default."""
    slo = report.slo
    marks = {id(report.default): "D"} | ({id(report.best): "*"} if report.best is not None else {})
    lines = [*candidate_table(report, itl), "", *learned(report), "",
             f"Pareto front ({itl} against prefill throughput); * chosen, D SGLang's default",
             *trial_table(report.front, slo, marks, itl), "", *front_plot(report, itl=itl), "", *(notes or [])]
    if report.best is None:
        return [*lines, "no configuration meets the SLOs; the closest:", *trial_table(report.closest, slo, itl=itl)]
    lines.append("chosen: SGLang's default (no other configuration beat it by more than the noise)" if kept_default
                 else "chosen: best goodput among the configurations that meet the SLOs")
    lines += comparison(report, itl)
    if itl == "ITL p99":
        lines.append(f"figures {ENGINE_WINDOW}")
    if out:
        lines.append(f"wrote {out} (SGLang: --pdmux-config-path {out}; pdtop --config {out})")
    return lines


def ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b):
        return fmt.MISSING
    return f"x{a / b:.2f}" if b else ("x1.00" if a == 0 else "inf")


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def trial_json(t: Trial, slo: Slo) -> dict[str, Any]:
    r = t.result
    config = {k: v for k, v in t.config.to_dict().items() if k in SGLANG_KEYS}
    return {"config": config, "itl_p99_ms": _finite(r.itl_p99_s * 1e3), "ttft_p99_ms": _finite(r.ttft_p99_s * 1e3),
            "prefill_tok_s": _finite(r.prefill_tok_s), "goodput_rps": _finite(r.goodput_rps),
            "good_requests": r.good, "requests": r.requests, "meets_slo": slo.met(r)}


def report_json(report: TuneReport, device: str, load: tuple[float, float, float]) -> dict[str, Any]:
    slo, run = report.slo, report.run
    return {
        "device": device,
        "workload": {k: getattr(report.scenario, k) for k in ("decode_bs", "decode_prompt", "long_tokens",
                                                              "long_prompts", "settle_rounds", "decode_tokens")},
        "slo": {"itl_ms": slo.itl_s * 1e3, "ttft_ms": None if slo.ttft_s is None else slo.ttft_s * 1e3},
        "decode_only_itl_ms": _finite(report.default.result.decode_only_itl_s * 1e3),
        "sglang": report.space.sglang,
        "search": {"sampler": "optuna TPE", "measured": run.measured, "configurations": len(report.trials),
                   "launches": run.launches, "grid_points": report.grid_size, "elapsed_s": run.elapsed_s,
                   "complete": run.complete, "stop": run.stop, "noise": run.noise,
                   "first_meeting_slo": run.first_meeting, "loadavg": list(load),
                   "effects": [{"knob": e.knob, "effect": e.effect, "values": e.values, "fixed": e.fixed}
                               for e in run.effects], "notes": report.space.notes},
        "candidates": [trial_json(t, slo) | {"measured": len(t.measurements)} for t in report.trials],
        "default": trial_json(report.default, slo),
        "chosen": trial_json(report.best, slo) if report.best is not None else None,
        "closest": [trial_json(t, slo) for t in report.closest],
        "front": [trial_json(t, slo) for t in report.front],
    }
