"""Writes `main.ndjson.gz`: what pdtop's encoder wrote before the wire was typed (issue 44), for events of
every type, made by the real producers of the time from fixed inputs. Run against that tree (commit
9f68b8e, `git worktree add ../base 9f68b8e`); it reads this tree's tests/telemetry for the pages it scrapes:

    cd /work/wt/base && PYTHONPATH=$PWD /work/main/.venv/bin/python \\
        /work/wt/h-wire/tests/telemetry/wire_v1/make_main.py | gzip -n \\
        > /work/wt/h-wire/tests/telemetry/wire_v1/main.ndjson.gz

Each line is one case: `{"case": name, "input": what the producer was given (or null), "wire": [event
texts]}`; `tests/telemetry/test_wire_v1.py` gives this tree's producers the same input and compares the
bytes. Pages are kept as their text, so the test does not depend on prometheus_client's rendering.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pdtop.engine.build import build_engine
from pdtop.engine.records import ConfigChange, KvTransfer, RequestRecord, RoundRecord
from pdtop.engine.roofline.kv import parse_link
from pdtop.engine.scheduling.commands import PinLevel, Set
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.workload import WorkloadSpec
from pdtop.telemetry import encode as ev
from pdtop.telemetry.hardware.hw import HwSampler
from pdtop.telemetry.scrape.page import read_page
from pdtop.telemetry.server.clients import _batch
from pdtop.telemetry.sources.fleet import FleetSource
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.sglang_split import SglangSplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for the page makers in tests/telemetry
from telemetry.disagg_servers import SglangPdMetrics, VllmNixlMetrics
from telemetry.servers import LLAMA, SglangMetrics, VllmMetrics

QWEN = "Qwen/Qwen2.5-7B-Instruct"
out: list[dict] = []


def case(name: str, wire: list[str], given: object = None) -> None:
    out.append({"case": name, "input": given, "wire": wire})


# ---- engine records: rounds, requests, config changes, transfers (the stream's path and json's) ----
engine = build_engine(device="sim:H100", model="synthetic:qwen3-8b", workload=WorkloadSpec(rate=50.0, seed=1))
seen: list = []
engine.add_sink(seen.append)
engine.submit(engine.prompts.make(700), 6, ignore_eos=True)
for i in range(12):
    if i == 3:
        engine.control(Set(decode_bs_divisor=12), client="c1")
    if i == 6:
        engine.control(PinLevel(2), client=None)
    engine.step()
config = engine.config_record()
rounds = [r for r in seen if isinstance(r, RoundRecord)]
requests = [r for r in seen if isinstance(r, RequestRecord)]
changes = [r for r in seen if isinstance(r, ConfigChange)]
picked = [rounds[0], next(r for r in rounds if r.prefills), rounds[-1],
          *{r.kind: r for r in requests}.values()]  # one request event of each kind
case("records fast", [ev.encode_record(r) for r in picked])
case("records json", [ev.encode(ev.record_event(r)) for r in picked])
case("config", [ev.encode(ev.config_event(c, config)) for c in changes])
case("hello engine", [ev.encode(ev.hello_event("c1", False, engine.describe(), "http://127.0.0.1:8000/v1")),
                      ev.encode(ev.hello_event("recorder", True, engine.describe()))])
case("seek", [ev.encode(ev.seek_event(2.5, config)), ev.encode(ev.seek_event(0.0, None))])
engine.close()

disagg = build_engine("sim:H100", policy="disagg", link=parse_link("rdma100"))
seen = []
disagg.add_sink(seen.append)
disagg.submit(disagg.prompts.make(100), 40, ignore_eos=True)
for _ in range(5):
    disagg.step()
disagg.submit(disagg.prompts.make(4096), 4, ignore_eos=True)
disagg.run_until_idle()
transfer = next(r for r in seen if isinstance(r, KvTransfer))
busy = next(r for r in seen if isinstance(r, RoundRecord) and r.disagg is not None and r.disagg.prefilling)
case("disagg fast", [ev.encode_record(r) for r in (transfer, busy)])
case("disagg json", [ev.encode(ev.record_event(r)) for r in (transfer, busy)])
disagg.close()

# ---- what the server says on its own ----
case("notices", [ev.encode(e) for e in (
    ev.dropped_event(3), ev.error_event("path", "disk full"), ev.error_event(None, "wrong token"),
    ev.reply_event("m1", False, "level", "too big"), ev.reply_event(7, True, path="run.ndjson"),
    ev.reply_event(None, True, readonly=False), ev.reply_event(2.5, True),
    ev.reply_event(None, False, None, "internal error: KeyError"))])
case("batch", [_batch([json.dumps(json.loads(out[0]["wire"][0]), separators=(",", ":")),
                       ev.encode(ev.dropped_event(1))])])

# ---- hardware: a fixed sample with and without a GPU, and this machine's real sampler ----
host = {"cpu_percent": [12.5, 0.0], "host_mem_used_bytes": 3 << 30, "host_mem_total_bytes": 16 << 30,
        "host_mem_percent": 18.8}
gpu = {"gpu_util_pct": 87, "mem_busy_pct": 40, "dram_bw_util_pct": 61.2, "sm_util_pct": "n/a",
       "sm_occupancy_pct": "n/a", "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "power_w": 412.3,
       "mem_used_mib": 70123, "mem_total_mib": 81559, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_reason": ""}
case("hw", [ev.encode(ev.hw_event(1700000000.25, host)), ev.encode(ev.hw_event(1700000001.25, {**host, **gpu}))],
     {"host": host, "gpu": gpu})
sampler = HwSampler(lambda e: None, gpu=True)
case("hw sampler", [ev.encode(sampler.sample())])  # values vary: the test compares the keys
sampler.stop()


# ---- scraped pages: each case feeds its pages, in order, to one PrometheusSource ----
def page_text(metrics) -> str:
    return generate_latest(metrics.registry).decode()


def scrape(name: str, pages: list[tuple[str, float]], *, split: bool = False, fail: str | None = None,
           model: str | None = None) -> list[dict]:
    src = PrometheusSource("http://user:pw@127.0.0.1:9/metrics", interval=1.0, window_s=30.0, model_name=model,
                           split=SglangSplit(config=PdmuxConfig(), sms=132) if split else None)
    wire, bodies = [], []
    for text, t in pages:
        events = src._scraped(read_page(text, CONTENT_TYPE_LATEST), t)
        wire += [ev.encode(e) for e in events]
        bodies += [e for e in events if e["type"] == "metrics"]
    if fail:
        wire += [ev.encode(e) for e in src._failed(fail)]
    case(name, wire, {"pages": pages, "split": split, "fail": fail, "model": model})
    return bodies


vllm = VllmMetrics(models=(LLAMA, QWEN))
first = page_text(vllm)
vllm.m(vllm.running).set(3)
vllm.m(vllm.waiting).set(1)
vllm.m(vllm.kv).set(0.25)
vllm.m(vllm.prompt_tokens).inc(900)
vllm.m(vllm.generation_tokens).inc(120)
for v in (0.03, 0.2, 0.9):
    vllm.m(vllm.ttft).observe(v)
for v in (0.01, 0.012, 0.02, 0.4):
    vllm.m(vllm.itl).observe(v)
vllm.m(vllm.e2e).observe(3.2)
vllm_bodies = scrape("scrape vllm", [(first, 100.0), (page_text(vllm), 101.5)], fail="connection refused")
scrape("scrape vllm other model", [(page_text(vllm), 100.0)], model=QWEN)
old = VllmMetrics(old_names=True)
scrape("scrape vllm old names", [(page_text(old), 5.0), (page_text(old), 6.0)])

sglang = SglangMetrics()
sglang.running.set(40)
sglang.queue.set(3)
sglang.token_usage.set(0.5)
sg_first = page_text(sglang)
sglang.prompt_tokens.inc(5000)
sglang.ttft.observe(0.7)
scrape("scrape sglang split", [(sg_first, 10.0), (page_text(sglang), 11.0)], split=True)
scrape("scrape sglang restart", [(page_text(sglang), 10.0), (sg_first, 11.0)])

prefill = SglangPdMetrics("prefill")
prefill.bootstrap_queue.set(3)
prefill.inflight_queue.set(2)
p_first = page_text(prefill)
for v in (8.0, 9.0, 30.0):
    prefill.latency_ms.observe(v)
prefill.speed_gb_s.observe(20.0)
prefill.transfer_failed.inc()
prefill_bodies = scrape("scrape sglang prefill", [(p_first, 1.0), (page_text(prefill), 2.0)])
decode = SglangPdMetrics("decode", old_gauges=True)
decode.prealloc_queue.set(1)
decode.latency_ms.set(12.5)
scrape("scrape sglang decode gauges", [(page_text(decode), 1.0)])
nixl = VllmNixlMetrics()
n_first = page_text(nixl)
nixl.xfer_time.observe(0.004)
nixl.bytes.observe(40e6)
nixl.failed.inc(2)
scrape("scrape vllm nixl", [(n_first, 1.0), (page_text(nixl), 2.0)])
scrape("scrape sglang on vllm", [(page_text(sglang), 1.0), (page_text(vllm), 2.0)])


# ---- a fleet: its hello, and a read with a live server, a stale one and one never read ----
async def fleet() -> None:
    servers = [("http://127.0.0.1:9", "prefill"), ("http://127.0.0.1:10", None), ("http://127.0.0.1:11", None)]
    for router in (None, "http://127.0.0.1:30000"):
        src = FleetSource(servers, router=router, interval=1.0, window_s=30.0)
        events = src.events()
        hello = await events.__anext__()
        await events.aclose()
        live, stale, never = src.members
        live.source.state, live.source.scrapes = "live", 2
        live.engine, live.model_name = "sglang", LLAMA
        live.last = {k: v for k, v in prefill_bodies[-1].items() if k not in ("type", "v")}
        stale.source.state, stale.source.scrapes, stale.source.last_error = "reconnecting", 1, "connection refused"
        stale.engine, stale.model_name = "vllm", None
        stale.last = {k: v for k, v in vllm_bodies[0].items() if k not in ("type", "v")}
        never.source.last_error = "unknown host"
        rows = [m.row() for m in src.members]
        case(f"fleet router={router}", [ev.encode(hello), ev.encode(ev.fleet_event(12.5, rows))],
             {"servers": servers, "router": router})


asyncio.run(fleet())

for line in out:
    print(json.dumps(line, separators=(",", ":")))
