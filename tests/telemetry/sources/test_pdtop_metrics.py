"""`PrometheusSource` against pdtop's own `/metrics`: `pdtop serve --api-port 0` with its synthetic workload."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import aclosing

from websockets.sync.client import connect

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Metrics
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.ui.app import PdtopApp

from ..conftest import header_text, next_of, shown
from ..conftest import until_shown as until


async def test_pdtop_serve_metrics_show_its_engine_model_split_and_traffic():
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", "serve", "--device", "sim:H100", "--port", "0",
                             "--api-port", "0", "--rate", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        ws_url, api_url = proc.stdout.readline().split()[-1], proc.stdout.readline().split()[-1]
        with connect(ws_url) as ws:
            hello = decode_event(json.loads(ws.recv(timeout=10)))
        levels = [tuple(level) for level in hello.engine.levels]
        src = PrometheusSource(api_url.removesuffix("/v1"), interval=0.2, window_s=600)
        async with aclosing(src.events()) as events:
            target = decode_event(await next_of(events, "hello")).scrape
            assert (target.engine, target.model_name, target.models) == ("pdtop", hello.engine.model,
                                                                         [hello.engine.model])
            seen: list[Metrics] = []
            while not seen or seen[-1].ttft.count < 3 or seen[-1].itl.count < 3 or not seen[-1].generation_tokens_per_s:
                seen.append(decode_event(await next_of(events, "metrics", timeout=30)))
                assert len(seen) < 200, "no traffic"
        app = PdtopApp(PrometheusSource(api_url.removesuffix("/v1"), interval=0.2), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:  # the dashboard shows pdtop's split from its page
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.latest is not None, "a read")
            split = shown(app, "SplitPanel")
            assert "from pdtop:split_level" in split and "prefill" in split and "decode" in split
            assert "pdtop /metrics" in header_text(app)
    finally:
        proc.terminate()
        proc.wait(20)
    for m in seen:  # the three split gauges are one round's: a scrape never mixes two rounds
        assert m.not_exposed == []
        units = (m.prefill_units, m.decode_units)
        assert units == levels[int(m.split_level)] or units == (0, 0)  # (0, 0): an idle round
        assert 0 <= m.kv_usage <= 1 and m.running >= 0 and m.waiting >= 0
    last = seen[-1]
    assert last.ttft.p50_s > 0 and last.itl.p99_s > 0 and last.e2e.count > 0 and last.prompt_tokens_per_s > 0
