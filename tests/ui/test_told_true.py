"""The header, the status line and the help say what the server is doing (issue 42 items 1, 2, 12, 13):
a recording the server was started with, a server that cannot say, a wrong token, a paused workload and
how to use the API the header shows. A real sim engine served on loopback, the real app under Pilot."""
from __future__ import annotations

from pdtop.engine.scheduling.commands import PauseWorkload
from pdtop.telemetry.events import Hello
from pdtop.telemetry.server.server import TelemetryServer
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from ui.conftest import EngineServer, sim_engine

SIZE = (160, 48)


def header(app) -> str:
    return app.query_one("HeaderBar").text


def status(app) -> str:
    return app.query_one("StatusLine").text


async def test_a_server_started_recording_says_so_in_the_header(tmp_path, until):
    """`pdtop serve --record FILE`: hello says it records, so the header does not claim "not recording", and
    R stops that recording instead of being told "already recording"."""
    es = EngineServer(sim_engine(), record_dir=tmp_path).start()
    path = tmp_path / "from-the-start.ndjson"
    es.server.start_recording(str(path), confined=False)
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connection == "live" and app.state.rounds_seen > 2, "live rounds")
            app.repaint()
            assert app.state.recording == str(path)
            assert "◉ REC" in header(app) and "not recording" not in header(app)
            await pilot.press("R")
            await until(pilot, lambda: es.server.recorder is None, "R stops the server's recording")
            await until(pilot, lambda: "not recording" in header(app), "the header says it stopped")
    finally:
        es.close()


class ServerBeforeRecordingInHello(TelemetryServer):
    """A server as they were before `hello.recording`: its hello does not say what it records."""

    def _hello(self, client_id: str, readonly: bool, recording: bool = True) -> Hello:
        return super()._hello(client_id, readonly, recording=False)


async def test_a_server_that_cannot_say_shows_recording_unknown_until_it_is_told(tmp_path, until):
    engine = sim_engine()
    es = EngineServer(engine, record_dir=tmp_path)
    es.server = ServerBeforeRecordingInHello(engine, "127.0.0.1", 0, token=es.token, record_dir=tmp_path)
    es._call(es.server.start())
    es.port = es.server.port
    es.server.start_recording("theirs.ndjson")  # someone else's recording, which this hello cannot tell
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connection == "live", "live")
            app.repaint()
            assert "recording: unknown" in header(app) and "not recording" not in header(app)
            await pilot.press("R")  # a start: refused, and the refusal names the file
            await until(pilot, lambda: any("already recording" in n[2] for n in app.notices), "the refusal")
            app.repaint()
            assert app.state.recording == str(tmp_path / "theirs.ndjson") and "◉ REC" in header(app)
    finally:
        es.stop_server()
        es.close()


async def test_a_wrong_token_is_named_as_such_by_the_status_line_and_the_keys(served, until):
    app = PdtopApp(LiveSource(served.url, token="not-the-token"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live" and any("wrong token" in n[2] for n in app.notices),
                    "the server's notice")
        app.notices.clear()
        await pilot.press("d")
        refusal = app.notices[-1][2]
        assert "wrong token" in refusal and "no control token" not in refusal, refusal
        app.query_one("StatusLine").clear()
        app.repaint()
        assert "wrong token" in status(app) and "no control token" not in status(app), status(app)


async def test_a_paused_workload_is_not_described_as_running(stepped, until):
    app = PdtopApp(LiveSource(stepped.url, token=stepped.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        workload = app.state.info.workload
        assert workload and workload in status(app)
        stepped.engine.control(PauseWorkload())
        stepped.engine.step()
        await until(pilot, lambda: app.state.config.workload_paused, "the pause reaches the dashboard")
        app.query_one("StatusLine").clear()
        app.repaint()
        assert "workload paused" in status(app) and f"workload {workload}" not in status(app), status(app)


async def test_help_says_how_to_call_the_api_the_header_shows(served, until):
    """The header shows the API's address; the help says how to authorize (the token this dashboard holds)."""
    served.server.api_url = "http://127.0.0.1:40381/v1"
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live", "live")
        app.repaint()
        assert "api" in header(app)
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "the help screen")
        said = app.screen.api_text
        assert "http://127.0.0.1:40381/v1" in said and f"Authorization: Bearer {served.token}" in said, said


async def test_a_replay_does_not_offer_the_recorded_servers_api(tmp_path, ev, until):
    """The trial of issue 42: a replay of `pdtop serve --api-port` told, in its help, to `curl` the recorded
    server's API (long gone); the header already left the address out of a replay."""
    from pdtop.telemetry.recording.recorder import Recorder
    from pdtop.telemetry.sources.replay import ReplaySource

    path = tmp_path / "with-api.ndjson"
    rec = Recorder(path, {**ev.hello, "api": "http://127.0.0.1:40381/v1"})
    for i in range(3):
        rec.write_event(ev.round(i, 0.01 * (i + 1)), t=0.01 * i)
    rec.close()
    app = PdtopApp(ReplaySource(path, speed=16))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.rounds_seen == 3, "the rounds")
        assert app.state.api == "http://127.0.0.1:40381/v1" and "40381" not in header(app)
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "the help screen")
        assert app.screen.api_text == ""
