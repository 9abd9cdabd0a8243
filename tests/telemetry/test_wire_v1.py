"""Protocol v1 stays byte for byte what it was before the wire was typed (issue 44): the typed producers,
given what the dict-building ones were given, write the same text, for events of every type.

`wire_v1/main.ndjson.gz` holds what the tree before (commit 9f68b8e) wrote, one case a line:

    cd /work/wt/base && PYTHONPATH=$PWD /work/main/.venv/bin/python \\
        /work/wt/h-wire/tests/telemetry/wire_v1/make_main.py | gzip -n > tests/telemetry/wire_v1/main.ndjson.gz

(`make_main.py` says what each case is.) What only a running engine makes (rounds, requests, a
configuration, a description) is taken from the file: decoded, and written again by this tree.
"""
from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pdtop.engine.records import ConfigChange
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.encode import encode, encode_record, reply_event
from pdtop.telemetry.events import (
    EVENT_CLASSES,
    ConfigEvent,
    Dropped,
    ErrorNotice,
    Fleet,
    Hello,
    Hw,
    Metrics,
    Seek,
)
from pdtop.telemetry.hardware.hw import HwSampler
from pdtop.telemetry.scrape.page import read_page
from pdtop.telemetry.server.clients import _batch
from pdtop.telemetry.sources.fleet import FleetSource
from pdtop.telemetry.sources.prometheus import PrometheusSource
from pdtop.telemetry.sources.sglang_split import SglangSplit

MAIN = Path(__file__).parent / "wire_v1" / "main.ndjson.gz"
CASES = {c["case"]: c for c in map(json.loads, gzip.decompress(MAIN.read_bytes()).decode().splitlines())}


def main(name: str) -> list[str]:
    return CASES[name]["wire"]


def decoded(name: str) -> list:
    return [decode_event(json.loads(text)) for text in main(name)]


def test_the_cases_hold_every_event_type():
    written = {json.loads(text)["type"] for case in CASES.values() for text in case["wire"]}
    assert written == set(EVENT_CLASSES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_main_wrote_decodes_and_is_written_again_the_same(name):
    """Every event, through this tree's decoder and encoder (the stream's fast path for records)."""
    write = encode_record if name.endswith(" fast") else encode
    again = [write(event) for event in decoded(name)]
    if name.startswith("hw"):  # decoded, a GPU's integer figures are floats (87.0): the same values and keys
        assert [list(json.loads(t).items()) for t in again] == [list(json.loads(t).items()) for t in main(name)]
    else:
        assert again == main(name)


def test_engine_events_as_the_server_builds_them():
    hellos = decoded("hello engine")
    assert [encode(Hello(client_id=h.client_id, readonly=h.readonly, engine=h.engine, api=h.api))
            for h in hellos] == main("hello engine")
    events = decoded("config")
    changes = [ConfigChange(e.time, e.round_index, e.changes, e.client) for e in events]
    assert [encode(ConfigEvent.after(c, e.config)) for c, e in zip(changes, events, strict=True)] == main("config")
    assert [encode(Seek(2.5, events[-1].config)), encode(Seek(0.0, None))] == main("seek")


def test_notices_replies_and_batches():
    assert [encode(e) for e in (
        Dropped(3), ErrorNotice("path", "disk full"), ErrorNotice(None, "wrong token"),
        reply_event("m1", False, "level", "too big"), reply_event(7, True, path="run.ndjson"),
        reply_event(None, True, readonly=False), reply_event(2.5, True),
        reply_event(None, False, None, "internal error: KeyError"))] == main("notices")
    first_round = json.dumps(json.loads(main("records fast")[0]), separators=(",", ":"))
    assert [_batch([first_round, encode(Dropped(1))])] == main("batch")


def test_hardware_samples():
    given = CASES["hw"]["input"]
    host, gpu = given["host"], given["gpu"]
    assert [encode(Hw(1700000000.25, **host)), encode(Hw(1700000001.25, **host, **gpu))] == main("hw")
    sample = HwSampler(lambda e: None, gpu=True).sample()  # NVML here or not: the keys main's sampler wrote
    assert list(json.loads(encode(sample))) == list(json.loads(main("hw sampler")[0]))


def scrape(name: str) -> tuple[list[str], list[Metrics]]:
    """Case `name`'s pages through this tree's `PrometheusSource`: the texts written, and the reads."""
    given = CASES[name]["input"]
    src = PrometheusSource("http://user:pw@127.0.0.1:9/metrics", interval=1.0, window_s=30.0,
                           model_name=given["model"],
                           split=SglangSplit(config=PdmuxConfig(), sms=132) if given["split"] else None)
    events = [e for text, t in given["pages"] for e in src._scraped(read_page(text, CONTENT_TYPE_LATEST), t)]
    if given["fail"]:
        events += src._failed(given["fail"])
    return [encode(e) for e in events], [e for e in events if isinstance(e, Metrics)]


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("scrape ")))
def test_scraped_pages(name):
    """Each figure the page lacks is left out of `metrics` (and `disagg`), as before: not written as null."""
    assert scrape(name)[0] == main(name)


@pytest.mark.parametrize("router", [None, "http://127.0.0.1:30000"])
def test_a_fleet(router):
    given = CASES[f"fleet router={router}"]["input"]
    src = FleetSource([tuple(s) for s in given["servers"]], router=router, interval=1.0, window_s=30.0)

    async def hello() -> dict:
        events = src.events()
        first = await events.__anext__()
        await events.aclose()
        return first

    texts = [encode(asyncio.run(hello()))]
    live, stale, never = src.members
    live.source.state, live.source.scrapes = "live", 2
    live.engine, live.model_name = "sglang", "meta-llama/Llama-3.1-8B-Instruct"
    live.last = scrape("scrape sglang prefill")[1][-1]
    stale.source.state, stale.source.scrapes, stale.source.last_error = "reconnecting", 1, "connection refused"
    stale.engine, stale.model_name = "vllm", None
    stale.last = scrape("scrape vllm")[1][0]
    never.source.last_error = "unknown host"
    texts.append(encode(Fleet(12.5, [m.row() for m in src.members])))
    assert texts == main(f"fleet router={router}")
