"""What the dashboard says in words: why it cannot connect and when it retries, how to get controls,
counts that start from the server's, idle instead of a split, units with the right number."""
from __future__ import annotations

import asyncio
import socket

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.format import units
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.state import DashboardState
from pdtop.ui.words import shared_side

from .conftest import EngineServer, sim_engine

SIZE = (120, 30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_dead_address_says_why_and_when_it_retries(until):
    url = f"ws://127.0.0.1:{_free_port()}"  # nothing listens there
    app = PdtopApp(LiveSource(url, token="t"))
    async with app.run_test(size=SIZE) as pilot:
        status = app.query_one("StatusLine")
        await until(pilot, lambda: "cannot reach" in status.text, "the reason")
        assert f"cannot reach {url}: connection refused" in status.text
        assert "retrying in" in status.text or "retrying now" in status.text
        assert "connecting" in app.query_one("HeaderBar").text


async def test_a_read_only_attach_says_how_to_get_controls(served, until):
    app = PdtopApp(LiveSource(served.url))  # no token
    async with app.run_test(size=SIZE) as pilot:
        status = app.query_one("StatusLine")
        await until(pilot, lambda: app.connection == "live" and "read-only" in status.text, "the hint")
        assert "--token" in status.text and "$PDTOP_TOKEN" in status.text
    chosen = PdtopApp(LiveSource(served.url, token=served.token, readonly=True))  # asked for: no hint
    async with chosen.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: chosen.connection == "live" and chosen.state.rounds_seen > 0, "live")
        await pilot.pause(0.2)
        assert "--token" not in chosen.query_one("StatusLine").text


async def test_counts_start_from_the_servers_and_not_from_a_previous_server(until):
    """Attach late: the counters are the engine's totals. The server is replaced by another engine on
    the same port: the counters are the new engine's, nothing carried over."""
    first = EngineServer(sim_engine(rate=12.0), manual=True, max_event_rate=1e9).start()
    second = EngineServer(sim_engine(rate=12.0, seed=1), manual=True, max_event_rate=1e9)
    for _ in range(600):
        first.engine.step()
    app = PdtopApp(LiveSource(first.url, token=first.token))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.state.hello, "hello")
            totals = first.engine.describe().totals
            assert totals.arrived > 0
            assert (app.state.arrivals, app.state.first_tokens, app.state.finished) == \
                (totals.arrived, totals.first_token, totals.finished)
            port = first.port
            await asyncio.to_thread(first.stop_server)  # off this loop: the app must answer the close
            await until(pilot, lambda: app.connection == "reconnecting", "the server is gone")
            for _ in range(300):  # before the dashboard is back: only the totals in its hello tell
                second.engine.step()
            await asyncio.to_thread(second.start_server, port)
            await until(pilot, lambda: app.connection == "live", "reconnected")
            totals = second.engine.describe().totals
            assert (app.state.arrivals, app.state.finished) == (totals.arrived, totals.finished)
    finally:
        await asyncio.to_thread(first.close)
        await asyncio.to_thread(second.close)


async def test_no_work_reads_idle(until):
    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=0.0))
    es = EngineServer(engine, manual=True).start()
    app = PdtopApp(LiveSource(es.url, token=es.token))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connection == "live", "live")
            for _ in range(5):
                engine.step()
            await until(pilot, lambda: app.state.rounds_seen >= 5, "rounds")
            app.repaint()
            split = " ".join(t.plain for t in app.query_one("SplitPanel")._last_texts)
            assert "idle" in split and "prefill 132" not in split
    finally:
        es.close()


def test_units_have_the_right_number():
    assert units(1, "cores") == "1 core" and units(2, "cores") == "2 cores" and units(0, "cores") == "0 cores"
    assert units(1, "SMs") == "1 SM" and units(132, "SMs") == "132 SMs"


@pytest.mark.parametrize(("running", "waiting", "level", "why"), [
    (3, 0, 0, "decode has no cores of its own: it time-shares prefill's 2 cores, both slower"),
    (0, 0, 0, "decode has no cores of its own"),
    (3, 2, 2, "prefill has no cores of its own: it time-shares decode's 2 cores"),
    (3, 2, 1, None),
])
def test_pinning_a_cpu_side_to_no_cores_is_called_out(ev, running, waiting, level, why):
    state = DashboardState()
    hello = ev.hello
    hello["engine"].update(unit_name="cores", units=2)
    hello["engine"]["config"]["levels"] = [[2, 0], [1, 1], [0, 2]]
    state.ingest(hello)
    state.running, state.waiting = running, waiting
    said = shared_side(state, level)
    assert (said is None) if why is None else said.startswith(why)


async def test_an_overlapped_split_reads_decode_on_the_whole_device(until):
    """overlap_decode_full_sm: decode's 132 SMs are the whole device beside prefill's 104, not a share."""
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

    config = PdmuxConfig(sm_group_num=3, manual_divisions=[[104, 0, 1]], overlap_decode_full_sm=True,
                         max_split_forward_layers=2)
    engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b", config=config, workload=WorkloadSpec(rate=0.0))
    for _ in range(4):
        engine.submit(engine.prompts.make(256), 500, ignore_eos=True)
    engine.run_until_idle(max_rounds=10)
    engine.submit(engine.prompts.make(8192), 4, ignore_eos=True)
    es = EngineServer(engine, manual=True).start()
    app = PdtopApp(LiveSource(es.url, token=es.token))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connection == "live", "live")
            engine.step()
            await until(pilot, lambda: app.state.rounds_seen >= 1, "a round")
            app.repaint()
            split = " ".join(t.plain for t in app.query_one("SplitPanel")._last_texts)
            assert "decode all 132 SMs, overlapping" in split and "prefill 104 SMs" in split
            assert "max layers 2" in split and "overlap" in split
    finally:
        es.close()
