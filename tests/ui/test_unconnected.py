"""Issue 25 item 15: a dashboard not connected yet says that nothing is known (not "all 0 units" or
"KV – 0/0"), and a bare host:port is refused naming both URL kinds attach takes."""
from __future__ import annotations

import subprocess
import sys

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp


def _shown(app, panel: str) -> str:
    app.repaint()
    return "\n".join(t.plain for t in app.query_one(panel)._last_texts)


async def test_nothing_known_before_the_first_message():
    app = PdtopApp(LiveSource("ws://127.0.0.1:9"), interval_s=0.05)  # nothing listens there
    for size in ((80, 24), (160, 48)):
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.3)
            split, requests = _shown(app, "SplitPanel"), _shown(app, "RequestsPanel")
            assert "nothing known yet" in split and "0 units" not in split and "one step" not in split
            assert "0/0" not in requests and "KV" in requests and "nothing known yet" in requests
            for name in ("SplitPanel", "RequestsPanel"):  # nothing cut at 80x24
                panel = app.query_one(name)
                assert all(t.cell_len <= panel.content_size.width for t in panel._last_texts), _shown(app, name)
        app = PdtopApp(LiveSource("ws://127.0.0.1:9"), interval_s=0.05)


def test_a_bare_host_port_names_ws_and_http():
    done = subprocess.run([sys.executable, "-m", "pdtop", "attach", "127.0.0.1:8765"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "ws://HOST:PORT" in done.stderr and "http://HOST:PORT" in done.stderr
