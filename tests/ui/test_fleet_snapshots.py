"""Snapshots of the fleet screen at 160x48 and 80x24, from a recording of a fleet: 4 SGLang prefill and
decode servers, a vLLM decode server with NIXL, one server stale; the balance says prefill queues."""
from __future__ import annotations

import json

import pytest
from telemetry.conftest import until_shown as until

from pdtop.telemetry.encode import wire
from pdtop.telemetry.events import Disagg, Fleet, FleetServer, FleetTarget, Hello, Metrics, Quantiles
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.screens.fleet import FleetScreen

STARTED = 1_796_000_000.0


def metrics(t: float, running: float, waiting: float, kv: float, itl: float, role: str | None, **disagg) -> Metrics:
    q = Quantiles(100.0, itl * 0.8, itl * 0.95, itl, 0.002)
    ttft = Quantiles(20.0, 0.21, 0.4, 0.52, 0.1)
    return Metrics(t, 30.0, running, waiting, kv, 5200.0, running * 40, ttft, q, e2e=ttft,
                   not_exposed=["split_level", "prefill_units", "decode_units"], role=role,
                   disagg=Disagg(**disagg) if disagg else None)


def server(i: int, role: str, state: str, m: Metrics | None, engine: str = "sglang",
           reason: str | None = None) -> FleetServer:
    port = 30000 + i
    return FleetServer(f"http://10.0.0.{i}:{port}/metrics", f"10.0.0.{i}:{port}", role, "engine_type", state, reason,
                       engine, "meta-llama/Llama-3.1-8B-Instruct", 30, m.time if m else None, m)


def recording(path) -> None:
    hello = wire(Hello(client_id="fleet", readonly=True, engine=None, fleet=FleetTarget(1.0, 30.0, None)))
    lines = [json.dumps({"format": "pdtop-recording", "format_version": 1, "pdtop": "0.1.0", "started": STARTED,
                         "hello": hello})]
    for k in range(12):
        t = STARTED + k
        rows = [server(1, "prefill", "live", metrics(t, 4, 2 + k // 2, 0.55, 0.03, "prefill", prefill_bootstrap_queue=3,
                                                        prefill_inflight_queue=1, kv_transfer_latency_ms=8.5,
                                                        kv_transfer_speed_gb_s=21.0, kv_transfer_mb=48.0,
                                                        bootstrap_failures=0, transfer_failures=0, prefill_retries=0,
                                                        transfer_metrics="histogram")),
                server(2, "prefill", "live", metrics(t, 4, 2 + k // 2, 0.5, 0.03, "prefill", prefill_bootstrap_queue=2,
                                                        prefill_inflight_queue=2)),
                server(3, "decode", "live", metrics(t, 40, 0, 0.3, 0.012, "decode", decode_prealloc_queue=0,
                                                       decode_transfer_queue=1, kv_transfer_latency_ms=12.5,
                                                       kv_transfer_speed_gb_s=18.0, transfer_metrics="gauge")),
                server(4, "decode", "stale", metrics(STARTED, 38, 0, 0.28, 0.011, "decode"),
                       reason="cannot reach it: connection refused (nothing listens there)"),
                server(5, "decode", "live", metrics(t, 36, 0, 0.32, 0.014, None, kv_transfer_latency_ms=4.0,
                                                       kv_transfer_speed_gb_s=10.0, transfer_failures=1.0,
                                                       transfer_metrics="nixl"), engine="vllm")]
        lines.append(json.dumps({"t": float(k), "event": wire(Fleet(t, rows))}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
def test_snapshot_of_a_fleet(snap_compare, tmp_path, size):
    path = tmp_path / "fleet.ndjson"
    recording(path)
    app = PdtopApp(ReplaySource(path, speed=16.0), interval_s=0.05)

    async def run_before(pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.state.fleet is not None
                    and app.state.fleet.time == STARTED + 11, "the whole recording")
        app.screen.paint()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
