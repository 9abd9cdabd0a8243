"""An SGLang Model Gateway as pdtop meets it (issue 40) and as a hostile one would be (issue 38 item 10): a
DP-aware worker's ranks are one row read once, gRPC workers' rows come from the gateway's
`/engine_metrics`, the token goes only where the user named it, and a listing that drips, nests deep or
runs long is cut off in one line."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from contextlib import aclosing

import httpx
import pytest

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.sources.fleet import FleetSource
from pdtop.telemetry.sources.router import NotARouter, list_workers, probe_router
from pdtop.ui.app import PdtopApp

from ..conftest import next_of
from ..conftest import until_shown as until
from ..disagg_servers import GatewayServer, SglangPdMetrics
from ..servers import PageServer, SglangMetrics, VllmMetrics


async def until_rows(events, predicate, timeout: float = 15.0) -> dict:
    """The next `fleet` event's servers by URL (without /metrics) for which `predicate` holds."""
    async def find() -> dict:
        while True:
            fleet = decode_event(await next_of(events, "fleet"))
            rows = {s.url.removesuffix("/metrics"): s for s in fleet.servers}
            if predicate(rows):
                return rows
    return await asyncio.wait_for(find(), timeout)


async def test_a_dp_aware_workers_ranks_are_one_row_read_once():
    sglang = SglangMetrics()
    sglang.running.set(8)
    sglang.server = PageServer(sglang.registry)
    base = sglang.server.url
    gateway = GatewayServer([(f"{base}@{rank}", "regular") for rank in range(4)])
    source = FleetSource([], router=gateway.url, interval=0.1, window_s=60)
    try:
        async with aclosing(source.events()) as events:
            rows = await until_rows(events, lambda r: len(r) == 1 and all(s.reads >= 3 for s in r.values()))
        row = rows[base]
        assert row.dp_ranks == [0, 1, 2, 3] and row.metrics.running == 8 and row.address == base.split("//")[1]
        reads = sum(path == "/metrics" for path, _ in sglang.server.requests)
        assert reads <= row.reads + 2  # once a read, not once per rank
        app = PdtopApp(FleetSource([], router=gateway.url, interval=0.1), interval_s=0.05)
        async with app.run_test(size=(160, 48)) as pilot:  # one row on the fleet screen, its ranks counted
            table = lambda: "\n".join(t.plain for t in app.screen.query_one("FleetTable").lines)  # noqa: E731
            await until(pilot, lambda: "DP×4" in table() and "live" in table(), "the row")
            assert len(app.screen.query_one("FleetTable").lines) == 1
            await app.source.close()
    finally:
        await source.close()
        gateway.close()
        sglang.server.close()


async def test_grpc_workers_rows_come_from_the_gateways_engine_metrics():
    prefill, decode, vllm = SglangPdMetrics("prefill"), SglangPdMetrics("decode"), VllmMetrics()
    prefill.queue.set(5)
    prefill.bootstrap_queue.set(2)
    decode.running.set(30)
    decode.token_usage.set(0.7)
    vllm.m(vllm.running).set(4)
    pages = {"grpc://10.0.0.1:30001": prefill.registry, "grpc://10.0.0.2:30002": decode.registry,
             "grpc://10.0.0.3:8000": vllm.registry}
    gateway = GatewayServer([("grpc://10.0.0.1:30001", "prefill"), ("grpc://10.0.0.2:30002", "decode"),
                             ("grpc://10.0.0.3:8000", "regular"), ("grpc://10.0.0.9:1", "decode")], pages)
    source = FleetSource([], router=gateway.url, interval=0.1, window_s=60)
    started = time.monotonic()
    try:
        async with aclosing(source.events()) as events:
            rows = await until_rows(events, lambda r: len(r) == 4 and sum(s.state == "live" for s in r.values()) == 3
                                    and r["grpc://10.0.0.9:1"].reason is not None)
        p, d, v, gone = (rows[u] for u in ("grpc://10.0.0.1:30001", "grpc://10.0.0.2:30002", "grpc://10.0.0.3:8000",
                                         "grpc://10.0.0.9:1"))
        assert (p.role, p.engine, p.metrics.waiting, p.metrics.disagg.prefill_bootstrap_queue) == \
            ("prefill", "sglang", 5, 2)
        assert (d.role, d.metrics.running, d.metrics.kv_usage) == ("decode", 30, 0.7)
        assert (v.engine, v.metrics.running) == ("vllm", 4)
        assert p.via == gateway.url + "/engine_metrics" and p.address == "10.0.0.1:30001"
        assert gone.state == "connecting" and "no series of grpc://10.0.0.9:1" in gone.reason
        engine_reads = sum(path == "/engine_metrics" for path, _ in gateway.requests)
        assert engine_reads <= (time.monotonic() - started) / 0.05 + 1  # at most one a half interval, for all four
    finally:
        await source.close()
        gateway.close()


async def test_the_token_goes_only_where_the_user_named_it():
    named, listed = VllmMetrics(), VllmMetrics()
    named.server, listed.server = PageServer(named.registry), PageServer(listed.registry)
    gateway = GatewayServer([(listed.server.url, "regular")])
    source = FleetSource([(named.server.url, None)], router=gateway.url, token="s3cret", interval=0.1)
    try:
        async with aclosing(source.events()) as events:
            await until_rows(events, lambda r: len(r) == 2 and all(s.reads for s in r.values()))
        assert all(h.get("Authorization") == "Bearer s3cret" for _, h in named.server.requests)
        assert all(h.get("Authorization") == "Bearer s3cret" for _, h in gateway.requests)
        assert listed.server.requests and not any("Authorization" in h for _, h in listed.server.requests)
    finally:
        await source.close()
        for server in (named.server, listed.server, gateway):
            server.close()


def _hostile_listings() -> list[tuple[str, bytes]]:
    deep = b'{"workers": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    return [("nests 200,000 deep", deep),
            ("over 1 MiB", json.dumps({"urls": ["http://h:1"] * 200_000}).encode())]


async def test_a_hostile_listing_is_refused_in_bounded_time():
    gateway = GatewayServer([])
    try:
        for what, body in _hostile_listings():
            gateway.listing = body
            assert probe_router(gateway.url) is None, what
            async with httpx.AsyncClient() as client:
                with pytest.raises(NotARouter):
                    await list_workers(client, gateway.url)
        gateway.listing, gateway.drip_s = b'{"urls": ["http://127.0.0.1:9"]}' + b" " * 4096, 0.2  # a byte a 0.2 s
        started = time.monotonic()
        assert probe_router(gateway.url, timeout=1.0) is None
        async with httpx.AsyncClient(timeout=1.0) as client:
            with pytest.raises(NotARouter, match="within 1 s"):
                await list_workers(client, gateway.url, timeout=1.0)
        assert time.monotonic() - started < 10  # main: 0.2 s x 4,130 bytes, twice
    finally:
        gateway.drip_s = 0
        gateway.close()


def test_record_is_not_held_by_a_dripping_listing(tmp_path):
    """A listing at a byte a second (issue 38 item 10: `record` hung past 40 s on main): the probe gives up
    after its 1.5 s deadline per listing path, and `record` reads the address as one server."""
    gateway = GatewayServer([])
    gateway.listing, gateway.drip_s = b'{"urls": ["http://127.0.0.1:9"]}' + b" " * 4096, 1.0
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pdtop", "record", gateway.url, "-o", str(tmp_path / "r.ndjson"),
                               "--duration", "1"], capture_output=True, text=True, timeout=60)
    finally:
        gateway.drip_s = 0
        gateway.close()
    # it ends on time, having recorded nothing: exit 1 since issue 42 item 19
    assert done.returncode == 1 and "nothing recorded" in done.stderr.splitlines()[-1], done.stderr
    assert time.monotonic() - started < 20
    assert "no /metrics at this address" in done.stderr  # read as one server: the gateway has no /metrics

