"""Stopping the server shows a clear state; the dashboard reconnects when it is back on the same port."""
from __future__ import annotations

import asyncio

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp


async def test_disconnect_shows_and_reconnects(served, until):
    app = PdtopApp(LiveSource(served.url, token=served.token))
    async with app.run_test(size=(130, 40)) as pilot:
        header = app.query_one("HeaderBar")
        await until(pilot, lambda: app.connection == "live" and app.state.rounds_seen > 2, "live rounds")
        await until(pilot, lambda: "● live" in header.text, "the header says live")
        port = served.port

        await asyncio.to_thread(served.stop_server)  # off this loop: the app must answer the close
        await until(pilot, lambda: app.connection == "reconnecting", "the source notices the server is gone")
        await until(pilot, lambda: "reconnecting" in header.text, "the header says reconnecting")
        seen = app.state.rounds_seen

        await asyncio.to_thread(served.start_server, port)
        assert served.port == port
        await until(pilot, lambda: app.connection == "live", "reconnected")
        await until(pilot, lambda: app.state.rounds_seen > seen + 2, "rounds flow again")
        await until(pilot, lambda: "● live" in header.text, "the header says live again")
        # controls work on the new connection
        await pilot.press("a" if served.engine.config_record().pinned_level is not None else "minus"
                          if (app.state.shown_level or 0) > 0 else "plus")
        await until(pilot, lambda: any(n[1] == "applied" for n in app.notices), "a control applied after reconnect")
