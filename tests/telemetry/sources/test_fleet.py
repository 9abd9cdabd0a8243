"""A fleet (`pdtop attach URL URL ...`): SGLang prefill and decode servers and a vLLM server with NIXL
side by side on loopback, their roles and disaggregation figures, a server that goes away and comes
back, an SGLang Model Gateway's worker listing, the fleet screen with Pilot at 160x48 and 80x24 (Enter
drills down, Escape returns, 32 servers scroll), and a fleet recorded and replayed."""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from contextlib import aclosing

import pytest

from pdtop.commands import attach
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Fleet
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.sources.fleet import FleetSource
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.screens.fleet import FleetScreen

from ..conftest import header_text, next_of
from ..conftest import until_shown as until
from ..disagg_servers import GatewayServer, SglangPdMetrics, VllmNixlMetrics, serve
from ..servers import PageServer, SglangMetrics


@pytest.fixture
def pd():
    """An SGLang prefill server (newer: histograms), an SGLang decode server (older: gauges), a vLLM NIXL one."""
    prefill, decode, vllm = serve(SglangPdMetrics("prefill")), serve(SglangPdMetrics("decode", old_gauges=True)), \
        serve(VllmNixlMetrics())
    yield prefill, decode, vllm
    for m in (prefill, decode, vllm):
        m.server.close()


def rows_of(event: dict) -> dict:
    fleet = decode_event(event)
    assert isinstance(fleet, Fleet)
    return {s.url.rsplit("/", 1)[0]: s for s in fleet.servers}


async def until_rows(events, predicate, timeout: float = 15.0) -> dict:
    async def find() -> dict:
        while True:
            rows = rows_of(await next_of(events, "fleet"))
            if predicate(rows):
                return rows
    return await asyncio.wait_for(find(), timeout)


async def test_roles_disaggregation_figures_stale_and_back(pd):
    prefill, decode, vllm = pd
    prefill.queue.set(6)
    prefill.bootstrap_queue.set(3)
    prefill.inflight_queue.set(2)
    decode.prealloc_queue.set(1)
    decode.transfer_queue.set(4)
    decode.token_usage.set(0.3)
    decode.latency_ms.set(12.5)  # older SGLang: gauges
    decode.speed_gb_s.set(18.0)
    src = FleetSource([(prefill.server.url, None), (decode.server.url, None), (vllm.server.url, "decode")],
                      interval=0.1, window_s=600)
    async with aclosing(src.events()) as events:
        hello = decode_event(await next_of(events, "hello"))
        assert hello.fleet is not None and hello.engine is None and hello.scrape is None
        rows = await until_rows(events, lambda r: all(s.reads >= 1 for s in r.values()))
        for v in (8.0, 9.0, 30.0):  # newer SGLang: histograms, read as p50 over the window
            prefill.latency_ms.observe(v)
        prefill.speed_gb_s.observe(20.0)
        prefill.transfer_failed.inc()
        vllm.xfer_time.observe(0.004)
        vllm.bytes.observe(40e6)
        vllm.failed.inc(2)
        # every figure observed above, in one read: a scrape served while they were made can hold the counter
        # and not yet the histograms (prometheus_client reads them one by one; CI once read it so)
        rows = await until_rows(events, lambda r: r[prefill.server.url].metrics.disagg.transfer_failures == 1
                                and r[vllm.server.url].metrics.disagg.transfer_failures == 2
                                and r[prefill.server.url].metrics.disagg.kv_transfer_speed_gb_s is not None
                                and r[prefill.server.url].metrics.disagg.kv_transfer_latency_ms is not None
                                and r[vllm.server.url].metrics.disagg.kv_transfer_speed_gb_s is not None)
        p, d, v = rows[prefill.server.url], rows[decode.server.url], rows[vllm.server.url]
        assert (p.role, p.role_from, d.role, d.role_from, v.role, v.role_from) == \
            ("prefill", "engine_type", "decode", "engine_type", "decode", "option")
        assert p.address == prefill.server.url.removeprefix("http://") and p.engine == "sglang" and v.engine == "vllm"
        assert p.metrics.waiting == 6 and p.metrics.disagg.prefill_bootstrap_queue == 3
        assert p.metrics.disagg.prefill_inflight_queue == 2 and 5 < p.metrics.disagg.kv_transfer_latency_ms <= 10
        assert p.metrics.disagg.transfer_metrics == "histogram"
        assert d.metrics.disagg.decode_transfer_queue == 4 and d.metrics.disagg.kv_transfer_latency_ms == 12.5
        assert d.metrics.disagg.kv_transfer_speed_gb_s == 18.0 and d.metrics.disagg.transfer_metrics == "gauge"
        assert v.metrics.disagg.kv_transfer_speed_gb_s == pytest.approx(40e6 / 0.004 / 1e9)
        assert v.metrics.disagg.transfer_metrics == "nixl" and 1 <= v.metrics.disagg.kv_transfer_latency_ms <= 5
        decode.server.status = 503  # goes away: its row stays, stale, with the reason and its last figures
        rows = await until_rows(events, lambda r: r[decode.server.url].state == "stale")
        assert "HTTP 503" in rows[decode.server.url].reason and rows[decode.server.url].metrics.kv_usage == 0.3
        decode.server.status = 200  # comes back
        await until_rows(events, lambda r: r[decode.server.url].state == "live")
    await src.close()


async def test_a_gateways_worker_listing_gives_the_servers_and_their_roles(pd):
    prefill, decode, vllm = pd
    gateway = GatewayServer([(prefill.server.url, "prefill"), (vllm.server.url, "decode"),
                             (decode.server.url, "regular")])
    try:
        source = attach.make_source(_args(gateway.url, "--interval", "0.1"))
        assert isinstance(source, FleetSource) and source.router == gateway.url
        source.router_every_s = 0.2
        async with aclosing(source.events()) as events:
            rows = await until_rows(events, lambda r: len(r) == 3 and all(s.reads for s in r.values()))
            assert [rows[u].role for u in (prefill.server.url, vllm.server.url, decode.server.url)] == \
                ["prefill", "decode", "unified"]
            assert {s.role_from for s in rows.values()} == {"router"}
            gateway.workers = gateway.workers[:2]  # the gateway drops one: kept, stale, saying so
            rows = await until_rows(events, lambda r: r[decode.server.url].state == "stale")
            assert rows[decode.server.url].reason == "no longer in the router's worker list"
        await source.close()
    finally:
        gateway.close()


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    return parser.parse_args(list(argv))


def _table_text(app) -> str:
    return "\n".join(line.plain for line in app.screen.query_one("FleetTable").lines)


async def test_the_fleet_screen_rows_balance_drill_down_and_back(pd):
    prefill, decode, vllm = pd
    prefill.queue.set(6)
    decode.token_usage.set(0.3)
    vllm.m(vllm.kv).set(0.3)
    decode.latency_ms.set(12.5)
    decode.speed_gb_s.set(18.0)
    for size in ((160, 48), (80, 24)):
        source = attach.make_source(_args(prefill.server.url, "--decode", decode.server.url, "--decode",
                                          vllm.server.url, "--interval", "0.1"))
        app = PdtopApp(source, interval_s=0.05)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda app=app: isinstance(app.screen, FleetScreen) and app.state.fleet.servers
                        and all(s.reads for s in app.state.fleet.servers), "every server read")
            await pilot.pause(0.3)
            text = _table_text(app)
            for m in (prefill, decode, vllm):
                assert m.server.url.removeprefix("http://") in text
            assert "prefill" in text and "decode" in text
            balance = str(app.screen.query_one("#fleet-balance").render())
            assert "prefill queue queued (6 waiting) while the decode pool runs at 30% of its KV: add prefill " \
                   "capacity" in balance
            kv = str(app.screen.query_one("#fleet-kv").render())
            assert "12.5 ms" in kv and "18.0 GB/s" in kv
            head = str(app.screen.query_one("#fleet-head").render())
            assert "3 servers (1 prefill, 2 decode)" in head and "3 live" in head
            await pilot.press("down", "enter")  # the decode server's own view
            await until(pilot, lambda app=app: not isinstance(app.screen, FleetScreen), "the drill-down")
            assert app.state.scrape.target.url == decode.server.url + "/metrics"
            app.repaint()
            assert decode.server.url.removeprefix("http://") in header_text(app)
            await pilot.press("escape")
            await until(pilot, lambda app=app: isinstance(app.screen, FleetScreen), "back to the fleet")
        await source.close()


async def test_32_servers_fit_and_the_table_scrolls():
    metrics = SglangMetrics()
    server = PageServer(metrics.registry)
    try:
        urls = [f"{server.url}/metrics/{i}" for i in range(32)]
        source = FleetSource([(u, None) for u in urls], interval=1.0)
        app = PdtopApp(source, interval_s=0.05)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.state.fleet.servers
                        and all(s.reads for s in app.state.fleet.servers), "32 servers read")
            await pilot.pause(0.3)
            table = app.screen.query_one("FleetTable")
            assert table.row_count == 32 and table.virtual_size.height > table.size.height
            await pilot.press("down", "down")
            assert table.cursor_row == 2
            await pilot.press("end")
            await pilot.pause(0.2)
            assert table.scroll_y > 0
            await pilot.press("enter")  # the last server's own view
            await until(pilot, lambda: app.state.scrape is not None and app.state.scrape.target.url == urls[31],
                        "the 32nd server")
        await source.close()
    finally:
        server.close()


def test_record_and_replay_a_fleet(pd, tmp_path):
    prefill, decode, _ = pd
    prefill.queue.set(2)
    path = tmp_path / "fleet.ndjson"
    done = subprocess.run([sys.executable, "-m", "pdtop", "record", "--prefill", prefill.server.url, "8998",
                           "--decode", decode.server.url, "-o", str(path), "--interval", "0.1", "--duration", "1.5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    recording = read_recording(path)
    assert decode_event(recording.hello).fleet is not None
    fleets = [decode_event(e) for _, e in recording if e["type"] == "fleet"]
    assert fleets and fleets[-1].servers[0].role == "prefill" and fleets[-1].servers[0].metrics.waiting == 2

    async def replayed() -> str:
        app = PdtopApp(ReplaySource(path, speed=4.0), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.state.fleet.servers
                        and app.state.fleet.servers[0].metrics is not None, "the replayed fleet")
            await pilot.pause(0.3)
            return _table_text(app)

    text = asyncio.run(replayed())
    assert prefill.server.url.removeprefix("http://") in text and decode.server.url.removeprefix("http://") in text


def test_bad_fleet_options_are_one_line():
    for argv, said in ((["ws://127.0.0.1:9", "http://127.0.0.1:10"], "a fleet is read over http://"),
                       (["http://127.0.0.1:9", "http://127.0.0.1:10", "--sglang-log", "x"], "is for one server"),
                       (["--prefill", "http://127.0.0.1:9", "port"], "--prefill takes URL [BOOTSTRAP_PORT]"),
                       ([], "give a URL")):
        with pytest.raises(ValueError, match=None) as refused:
            attach.make_source(_args(*argv))
        assert said in str(refused.value) and "\n" not in str(refused.value)


def test_worker_listings_of_both_gateway_shapes_and_what_is_no_listing():
    from pdtop.telemetry.sources.router import MAX_WORKERS, NotARouter, Worker, probe_router, workers_of

    newer = {"workers": [{"url": "http://p:1", "worker_type": "prefill"},
                         {"url": "http://d:2", "worker_type": "decode"},
                         {"url": "http://r:3", "worker_type": "regular"}, {"url": "grpc://g:4"}, {"no": "url"}, 7,
                         {"url": "http://dp:5@0", "worker_type": "regular"},
                         {"url": "http://dp:5@1", "worker_type": "regular"}],
             "total": 8}
    assert workers_of(newer) == [Worker("http://p:1", "prefill"), Worker("http://d:2", "decode"),
                                 Worker("http://r:3", "unified"), Worker("grpc://g:4", None),
                                 Worker("http://dp:5", "unified", (0, 1))]
    assert workers_of({"urls": ["http://a:1", 5, "ftp://x"]}) == [Worker("http://a:1", None)]
    assert len(workers_of({"urls": [f"http://h:{i}" for i in range(10 * MAX_WORKERS)]})) == MAX_WORKERS
    for not_one in ({"models": []}, [], "text", {"workers": "x"}):
        with pytest.raises(NotARouter):
            workers_of(not_one)
    huge = PageServer()
    huge.body = b'{"urls": ["' + b"x" * (3 << 20) + b'"]}'  # over the 1 MiB a listing may be: not read on
    try:
        assert probe_router(huge.url) is None
    finally:
        huge.close()
