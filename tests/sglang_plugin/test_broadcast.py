"""Two TP ranks: a change from pdtop's client travels through SGLang's `/set_internal_state` to both ranks'
schedulers in the same round (their hooked `set_internal_state`), so both return the same level at the
next switch; a change a rank refuses changes neither; without a route to that endpoint control is refused.

Two real `Scheduler` objects run SGLang's pdmux loop in lockstep, one round each in turn, as TP ranks do.
Standing in for SGLang's HTTP server and its tokenizer's request broadcast: a small HTTP server that
turns the POST into SGLang's own `SetInternalStateReq`, hands it to every rank's next round and answers
with their `updated` flags, as SGLang's endpoint does."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdtop.engine.errors import ControlError
from pdtop.engine.scheduling.commands import PinLevel
from pdtop.sglang_plugin.tap import TAP_ATTR

from .conftest import PDMUX_YAML, Client
from .cpu_sglang import Req, SchedulerThread, make_scheduler, publish_server_args, register_stand_ins


class SGLangEndpoint:
    """Stand-in for SGLang's HTTP server and tokenizer: POST /set_internal_state reaches every rank."""

    def __init__(self) -> None:
        self.ranks: list[SchedulerThread] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from sglang.srt.managers.io_struct import SetInternalStateReq

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                req = SetInternalStateReq(server_args=body["server_args"])
                seen = [len(r.outputs) for r in endpoint.ranks]
                for rank in endpoint.ranks:
                    rank.inbox.append(req)
                deadline = time.monotonic() + 20
                while any(len(r.outputs) == n for r, n in zip(endpoint.ranks, seen, strict=True)):
                    if time.monotonic() > deadline:
                        self.send_error(504)
                        return
                    time.sleep(0.01)
                out = json.dumps([r.outputs[n].updated for r, n in zip(endpoint.ranks, seen, strict=True)]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def two_ranks(sglang: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from sglang.srt.plugins import load_plugins

    from pdtop.sglang_plugin import entry

    endpoint = SGLangEndpoint()
    monkeypatch.setenv("PDTOP_SGLANG_PORT", "0")
    register_stand_ins()
    load_plugins()
    args = publish_server_args(tmp_path, PDMUX_YAML, host="127.0.0.1", port=endpoint.port)
    threads = []
    for rank in (0, 1):
        s = make_scheduler(args)
        s.tp_rank, s.tp_size = rank, 2
        s.init_pdmux()
        threads.append(SchedulerThread(s).start())
    endpoint.ranks = threads
    assert entry.installed is not None and len(entry.installed.servers) == 1  # rank 0 serves, rank 1 does not
    try:
        yield threads, entry.installed.servers[0].url, endpoint
    finally:
        for t in threads:
            t.stop()
        endpoint.close()


async def lockstep(ranks: list[SchedulerThread], n: int, arrivals: list[str] | None = None) -> None:
    """`n` rounds of every rank, one rank after the other each round, with the same arrivals."""
    def run() -> None:
        for i in range(n):
            for rank in ranks:
                rank.rounds(1, [Req(a, [5] * 2048, 2) if a.startswith("p") else Req(a, [5] * 256, 500)
                                for a in arrivals or []] if i == 0 else None)
    await asyncio.to_thread(run)


async def posted(ranks: list[SchedulerThread]) -> None:
    """Wait until the endpoint has queued a request for every rank's next round."""
    async def poll() -> None:
        while not all(r.inbox for r in ranks):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), 20)


def switches(rank: SchedulerThread) -> list[int]:
    return rank.scheduler.tp_worker.model_runner.decode_attn_backend


async def test_a_pin_reaches_every_rank_in_the_same_round(two_ranks: Any) -> None:
    ranks, url, _ = two_ranks
    client = await Client.open(url)
    await client.wait(lambda c: bool(c.of("hello")))
    assert "set_internal_state" in client.of("hello")[0]["engine"]["runtime"]["control"]
    await lockstep(ranks, 6, ["d0", "d1", "d2"])
    await lockstep(ranks, 2, ["p1"])
    assert switches(ranks[0])[-1] == switches(ranks[1])[-1] == 4

    await client.ws.send(json.dumps({"cmd": "pin_level", "level": 5}))
    await posted(ranks)  # pdtop posted it; the endpoint queued it for both ranks' next round
    await lockstep(ranks, 1)
    await client.wait(lambda c: bool(c.of("reply")))
    assert client.of("reply")[0]["ok"] and client.of("reply")[0]["change"] == {"pinned_level": {"old": None, "new": 5}}
    await client.wait(lambda c: bool(c.of("config")))
    assert client.of("config")[0]["changes"] == {"pinned_level": {"old": None, "new": 5}}
    assert [r.scheduler.__dict__[TAP_ATTR].knobs.pinned_level for r in ranks] == [5, 5]
    assert [r.outputs[-1].updated for r in ranks] == [True, True]
    await lockstep(ranks, 8)
    await lockstep(ranks, 2, ["p2"])
    assert switches(ranks[0]) == switches(ranks[1]) and switches(ranks[0])[-1] == 5
    await client.close()


async def test_a_change_a_rank_refuses_changes_no_rank(two_ranks: Any) -> None:
    ranks, _, endpoint = two_ranks
    configs = [r.scheduler.pdmux_config for r in ranks]

    def post(args: dict[str, Any]) -> Any:
        return httpx.post(f"http://127.0.0.1:{endpoint.port}/set_internal_state", json={"server_args": args},
                          timeout=30)

    above_one = {"pdtop_thresholds": 6, **{f"pdtop_threshold_{i}": 5 for i in range(6)}}  # would crash SGLang
    for bad in ({"pdtop_pinned_level": 7}, {"pdtop_decode_bs_divisor": 0}, {"pdtop_thresholds": 2}, above_one,
                {"pdtop_pinned_level": 3, "pdtop_nonsense": 1}):
        response = asyncio.create_task(asyncio.to_thread(post, bad))
        await posted(ranks)
        await lockstep(ranks, 1)
        assert (await response).json() == [False, False], bad
    assert [r.scheduler.pdmux_config for r in ranks] == configs
    assert all(r.scheduler.__dict__[TAP_ATTR].knobs.pinned_level is None for r in ranks)


async def test_without_a_route_to_set_internal_state_control_is_refused(two_ranks: Any) -> None:
    ranks, _, _ = two_ranks
    tap = ranks[0].scheduler.__dict__[TAP_ATTR]
    tap.send = None  # as when the scheduler does not know where SGLang's HTTP server listens
    with pytest.raises(ControlError, match="watch-only"):
        tap.control(PinLevel(3), "c1").result(0)
