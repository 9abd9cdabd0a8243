"""Live tuning from the dashboard: candidates reach the real engine through the control path, show as
configuration changes, and the operator keeps the best or gets the previous configuration back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import Input

import pdtop.ui.app
from pdtop.engine.records import ConfigChange
from pdtop.engine.scheduling.commands import PinLevel, Set
from pdtop.telemetry.encode import plain
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.keymap import parse_tune
from pdtop.ui.screens.tune import TuneScreen

SIZE = (130, 40)


class NoticeWatchingApp(PdtopApp):
    """The dashboard, also noting the engine's configuration at the moment each notice is shown."""

    CSS_PATH = str(Path(pdtop.ui.app.__file__).with_name(PdtopApp.CSS_PATH))

    def __init__(self, served) -> None:
        super().__init__(LiveSource(served.url, token=served.token))
        self.engine = served.engine
        self.told: list[tuple[str, dict]] = []

    def notify(self, message: str, **kwargs) -> None:
        self.told.append((message, plain(self.engine.config_record())))
        super().notify(message, **kwargs)


async def _told(pilot, until, word: str) -> dict:
    """The engine's configuration when the operator was told `word` (kept / rolled back)."""
    app = pilot.app
    await until(pilot, lambda: any(word in message for message, _ in app.told), f"told {word}")
    return next(config for message, config in app.told if word in message)


async def _start_tune(pilot, until, text: str) -> TuneScreen:
    await pilot.press("u")
    await until(pilot, lambda: len(pilot.app.screen_stack) == 2, "the tune prompt")
    pilot.app.screen.query_one(Input).value = text
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(pilot.app.screen, TuneScreen), "the tune panel")
    return pilot.app.screen


async def _with_previous_config(served, pilot, until) -> dict:
    """A configuration of the operator's (divisor 24, level 3 pinned) in force; the engine's view of it."""
    app, engine = pilot.app, served.engine
    await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
    engine.control(Set(decode_bs_divisor=24))
    engine.control(PinLevel(3))
    await until(pilot, lambda: app.state.config.decode_bs_divisor == 24 and app.state.config.pinned_level == 3,
                "the dashboard sees the operator's configuration")
    return plain(engine.config_record())


def _watch(engine) -> list[ConfigChange]:
    changes: list[ConfigChange] = []
    engine.add_sink(lambda r: changes.append(r) if isinstance(r, ConfigChange) else None)
    return changes


async def test_rollback_restores_the_previous_configuration(served, until):
    engine = served.engine
    changes = _watch(engine)
    app = NoticeWatchingApp(served)
    async with app.run_test(size=SIZE) as pilot:
        before = await _with_previous_config(served, pilot, until)
        screen = await _start_tune(pilot, until, "20 0.3")
        await until(pilot, lambda: not screen.running, "the tune to finish", timeout=60)
        assert screen.error is None, screen.error
        tuner = screen.tuner
        assert len(tuner.trials) >= 4 and tuner.trials[0].config.decode_bs_divisor == 24  # what was in force first
        tried = {json.dumps(c.changes["manual_divisions"]["new"]) for c in list(changes)
                 if "manual_divisions" in c.changes}
        assert len(tried) >= 3, tried  # the candidates really ran on the engine
        # and each reached the dashboard as a configuration change: a mark on the ITL chart
        assert sum("manual_divisions" in c.changes for c in app.state.config_changes) >= 3
        assert plain(engine.config_record()) != before
        await pilot.press("r")
        await until(pilot, lambda: not isinstance(app.screen, TuneScreen), "the panel closed")
        # told only once the engine reported it in force, the pinned level included
        assert await _told(pilot, until, "rolled back") == before
        assert tuner.on_event not in app.event_listeners


async def test_keep_leaves_the_best_in_force(served, until):
    engine = served.engine
    app = NoticeWatchingApp(served)
    async with app.run_test(size=SIZE) as pilot:
        await _with_previous_config(served, pilot, until)
        screen = await _start_tune(pilot, until, "50 0.3")
        await until(pilot, lambda: not screen.running, "the tune to finish", timeout=60)
        best = screen.tuner.best
        assert best is not None and screen.tuner.slo.met(best.result)
        await pilot.press("k")
        told = await _told(pilot, until, "kept")
        want = {k: v for k, v in best.config.to_dict().items() if k != "chunk_size"}
        off = {"max_split_forward_layers": 0, "overlap_decode_full_sm": False,  # keys on the wire only when on
               "chunked_prefill_size": 0}
        assert {k: told.get(k, off.get(k)) for k in want} == want  # in force before the operator is told
        assert engine.config_record().pinned_level is None  # the automatic choice the candidates ran with
        await until(pilot, lambda: not isinstance(app.screen, TuneScreen), "the panel closed")


async def test_escape_mid_run_stops_and_rolls_back(served, until):
    engine = served.engine
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        before = await _with_previous_config(served, pilot, until)
        screen = await _start_tune(pilot, until, "20 2")
        await until(pilot, lambda: screen.tuner.status == "measuring" and len(screen.tuner.trials) >= 1,
                    "a candidate being measured", timeout=30)
        await pilot.press("escape")
        await until(pilot, lambda: plain(engine.config_record()) == before,
                    "the previous configuration back on the engine")
        await until(pilot, lambda: not isinstance(app.screen, TuneScreen), "the panel closed")
        assert not screen.running


def test_tune_prompt_takes_the_slo_and_optionally_the_seconds_per_candidate():
    assert parse_tune("20") == (0.02, 5.0)
    assert parse_tune("12.5ms, 0.5s") == (0.0125, 0.5)
    for bad in ("", "fast", "20 5 1", "0", "20 0.01"):
        with pytest.raises(ValueError):
            parse_tune(bad)


async def test_every_candidate_is_measured_the_baseline_first(served, until):
    """Issue 25 item 4: the baseline row read `- ms - ms - 0.00/s no` and TTFT p99 was `-` on every row when
    no request finished inside a short window. The rounds' token gaps and the first tokens measure them."""
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        screen = await _start_tune(pilot, until, "50 1")  # 8 arrivals a window on average: none in 1 of 3,000
        await until(pilot, lambda: not screen.running, "the tune to finish", timeout=90)
        trials = screen.tuner.trials
        assert trials[0].config == screen.tuner.reference
        # the baseline is measured; so are most candidates (on a loaded machine a window may hold too few
        # decode rounds for a gap, or no first token: a split starving one side)
        figures = [(t.result.itl_p99_s, t.result.ttft_p99_s, t.config.manual_divisions) for t in trials]
        assert trials[0].result.itl_p99_s > 0 and trials[0].result.ttft_p99_s > 0, figures
        assert sum(t.result.itl_p99_s > 0 for t in trials) >= len(trials) / 2, figures
        assert sum(t.result.ttft_p99_s > 0 for t in trials) >= len(trials) / 2, figures
        status = str(screen.query_one("#tune-status").render())
        assert status.startswith("done") and "candidate" not in status, status  # not "candidate 3: done"
        await pilot.press("r")


async def test_keep_refuses_what_was_never_measured(until):
    """With nothing decoding, no window measures anything: `k` keeps nothing, says so, and the
    configuration before stays in force."""
    from pdtop.engine.build import build_engine

    from .conftest import EngineServer

    es = EngineServer(build_engine("sim:H100", workload=None)).start()
    try:
        app = NoticeWatchingApp(es)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.state.rounds_seen > 2 and app.connection == "live", "live rounds")
            before = plain(es.engine.config_record())
            screen = await _start_tune(pilot, until, "50 0.2")
            await until(pilot, lambda: not screen.running, "the tune to finish", timeout=60)
            assert not any(screen.tuner.measured(t.config) for t in screen.tuner.trials)
            await pilot.press("k")
            told = await _told(pilot, until, "nothing kept")
            assert told == before and "never measured" in next(m for m, _ in app.told if "nothing kept" in m)
    finally:
        es.close()


def test_the_knobs_in_force_keep_sglangs_newer_ones():
    """What a rollback restores: the cap and overlap in force, not their defaults."""
    from pdtop.engine.build import build_engine
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
    from pdtop.ui.live_tune import pdmux_of

    config = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 0, 1]], split_forward_token_budget=65536,
                         max_split_forward_layers=3, overlap_decode_full_sm=True)
    engine = build_engine("sim:H100", config=config)
    try:
        assert pdmux_of(engine.config_record()) == engine.config == config
    finally:
        engine.close()


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_tuning_panel_leaves_the_timeline_in_view(served, until, size):
    """Issue 42 item 6: with its candidates listed at 160x48 the panel covered the whole timeline, whose lanes
    show each candidate's split as it runs. It sits above it, and lists every candidate that fits."""
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.rounds_seen > 5 and app.connection == "live", "live rounds")
        screen = await _start_tune(pilot, until, "50 0.2")
        await until(pilot, lambda: not screen.running, "the tune to finish", timeout=60)
        await pilot.pause(0.1)
        box = screen.query_one("Vertical").region
        timeline = app.screen_stack[0].query_one("#timeline").region
        header = app.screen_stack[0].query_one("#header").region
        assert not box.overlaps(timeline) and not box.overlaps(header), (box, timeline)
        table = str(screen.query_one("#tune-table").render()).splitlines()
        trials = screen.tuner.trials
        if size == (160, 48):
            assert len(table) == 1 + len(trials), table  # every candidate listed
        else:  # what does not fit is said, the best stays listed
            listed = len(table) - 1 - ("earlier candidates not listed" in table[-1])
            assert listed == len(trials) or "earlier candidates not listed" in table[-1], table
            assert screen.tuner.best is None or any(line.startswith("*") for line in table), table
        await pilot.press("r")
