"""Live control of SGLang's split through pdtop's protocol: a pin is what SGLang's own `adjust_stream_groups`
returns at its next switch point while prefill and decode both run; a divisor or thresholds change takes
effect at the next switch; what SGLang cannot do live, and malformed input, is refused in one line and
leaves SGLang's config and choices as they were; the token gates control as for `pdtop serve`."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import Client, Served, serve
from .cpu_sglang import Req


async def rounds(served: Served, n: int, arrivals: list[Req] | None = None) -> None:
    await asyncio.to_thread(served.thread.rounds, n, arrivals)


async def ask(served: Served, client: Client, msg: dict[str, Any]) -> dict[str, Any]:
    """Send a control message and run rounds until its reply comes: SGLang's scheduler applies it at the
    first round boundary after pdtop's server has queued it, and the reply (with the change) comes then."""
    n = len(client.of("reply"))
    await client.ws.send(json.dumps(msg))
    await asyncio.sleep(0.05)  # usually long enough for pdtop's server to queue it: one round then
    for _ in range(50):
        await rounds(served, 1)
        if len(client.of("reply")) > n:
            break
        await asyncio.sleep(0.02)
    await client.wait(lambda c: len(c.of("reply")) > n)
    return client.of("reply")[n]


async def decoding_three(served: Served) -> None:
    """Three requests decoding for a long time (their 768-token prefill takes 3 rounds: 10 layers each)."""
    await rounds(served, 6, [Req(f"d{i}", [5] * 256, 500) for i in range(3)])
    assert served.switches[-1] == 7  # decode alone: SGLang's decode-only end


async def prefill(served: Served, name: str) -> None:
    """A 2,048-token prompt arrives and its split prefill starts (a switch point); 4 layers a round."""
    await rounds(served, 2, [Req(name, [5] * 2048, 2)])


async def finish_prefill(served: Served, slices: int = 7) -> None:
    """Run until the split prefill has done its 28 layers (4 a round: 7 slices) and decode runs alone."""
    await rounds(served, slices + 1)
    assert served.switches[-1] == 7


async def test_pin_is_what_sglang_returns_at_its_next_switch(served: Served) -> None:
    client = await Client.open(served.url)
    await decoding_three(served)
    await prefill(served, "p1")
    assert served.switches[-1] == 4  # SGLang's rule: 3 decoding * 6 split levels // divisor 4
    config_before = served.scheduler.pdmux_config

    switches = len(served.switches)
    reply = await ask(served, client, {"cmd": "pin_level", "level": 2, "id": 1})  # applied at the round boundary
    assert reply["ok"] and reply["id"] == 1 and reply["change"] == {"pinned_level": {"old": None, "new": 2}}
    await rounds(served, 1)  # no switch point yet: the level stays
    await client.wait(lambda c: bool(c.of("config")))
    change = client.of("config")[0]
    assert change["changes"] == {"pinned_level": {"old": None, "new": 2}} and change["client"] == "c1"
    assert change["config"]["pinned_level"] == 2
    assert len(served.switches) == switches
    await finish_prefill(served)  # one side idle: the whole-device end stays SGLang's
    await prefill(served, "p2")
    assert served.switches[-1] == 2  # SGLang's adjust_stream_groups returned the pinned level
    assert served.scheduler.pdmux_config is config_before  # its config is its own again after the call
    await rounds(served, 1)
    await client.wait(lambda c: any(e["level"] == 2 and e["pinned"] for e in c.of("round")))

    assert (await ask(served, client, {"cmd": "auto_level"}))["ok"]
    await finish_prefill(served)
    await prefill(served, "p3")
    assert served.switches[-1] == 4  # SGLang's own choice again
    await client.close()


async def test_divisor_and_thresholds_take_effect_at_the_next_switch(served: Served) -> None:
    client = await Client.open(served.url)
    await decoding_three(served)
    await prefill(served, "p1")
    assert served.switches[-1] == 4
    assert (await ask(served, client, {"cmd": "set", "decode_bs_divisor": 6}))["change"] == {
        "decode_bs_divisor": {"old": 4, "new": 6}}
    assert served.scheduler.pdmux_config.decode_bs_divisor == 6  # SGLang's own config, read at each switch
    assert served.switches[-1] == 4  # until the next switch point
    await finish_prefill(served)
    await prefill(served, "p2")
    assert served.switches[-1] == 3  # 3 * 6 // 6

    sm_counts = served.scheduler.sm_counts
    rows = [[p, d, t] for (p, d), t in zip(sm_counts[1:-1], [1, 5, 6, 7, 8, 9], strict=True)]
    assert (await ask(served, client, {"cmd": "set", "manual_divisions": rows}))["ok"]
    await finish_prefill(served)
    await prefill(served, "p3")
    assert served.switches[-1] == 1  # the last row whose threshold 3 decoding requests reach
    assert served.scheduler.pdmux_config.manual_divisions == rows
    assert (await ask(served, client, {"cmd": "set", "manual_divisions": [], "split_forward_token_budget": 4096}))["ok"]
    await finish_prefill(served, 14)  # its slices shrink to 2 layers from the next round on
    await prefill(served, "p4")
    assert served.switches[-1] == 3 and served.scheduler.pdmux_config.manual_divisions == []
    assert served.scheduler.pdmux_config.split_forward_token_budget == 4096
    await finish_prefill(served, 14)  # 4096 // 2048 tokens: 2 layers a round
    await client.wait(lambda c: any(p["layers_per_round"] == 2 for r in c.of("round") for p in r["prefills"]))
    await client.close()


REFUSED = [
    ({"cmd": "pin_level", "level": 0}, "level", "whole-device ends"),
    ({"cmd": "pin_level", "level": 7}, "level", "whole-device ends"),
    ({"cmd": "pin_level", "level": 99}, "level", "1..6"),
    ({"cmd": "pin_level", "level": "3"}, "level", "integer"),
    ({"cmd": "set", "sm_group_num": 4}, "sm_group_num", "restart"),
    ({"cmd": "set", "manual_divisions": [[100, 32, t] for t in range(6)]}, "manual_divisions", "restart"),
    ({"cmd": "set", "manual_divisions": [[112, 20, 1]] * 6}, "manual_divisions", "restart"),
    ({"cmd": "set", "manual_divisions": [[p, d, t] for (p, d), t in zip(  # a batch of 1 would crash SGLang
        [(112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60)], range(2, 8), strict=True)]},
     "manual_divisions", "UnboundLocalError"),
    ({"cmd": "set", "manual_divisions": [[112, 20, 1]]}, "manual_divisions", "restart"),
    ({"cmd": "set", "policy": "chunked"}, "policy", "at start"),
    ({"cmd": "set", "chunk_size": 512}, "chunk_size", "at start"),
    ({"cmd": "set", "workload_rate": 2.0}, "workload_rate", "no built-in workload"),
    ({"cmd": "set", "max_split_forward_layers": 4}, "max_split_forward_layers", "does not steer"),
    ({"cmd": "set", "decode_bs_divisor": 0}, "decode_bs_divisor", "1.."),
    ({"cmd": "inject", "prompt_tokens": 100}, "cmd", "own clients"),
    ({"cmd": "pause_workload"}, "cmd", "own clients"),
    ({"cmd": "launch_missiles"}, "cmd", "unknown command"),
    ("not json", None, ""),
]


async def test_what_sglang_cannot_do_live_is_refused_and_changes_nothing(served: Served) -> None:
    client = await Client.open(served.url)
    await decoding_three(served)
    config = served.scheduler.pdmux_config
    for message, field, words in REFUSED:
        reply = await client.request(message)
        assert not reply["ok"], message
        if field is not None:
            assert reply["error"]["field"] == field and words in reply["error"]["reason"], (message, reply)
        assert "\n" not in reply["error"]["reason"]
    await prefill(served, "p1")
    assert served.switches[-1] == 4  # SGLang's own choice, as before
    assert served.scheduler.pdmux_config is config and not client.of("config")
    assert served.tap.knobs.pinned_level is None
    await client.close()


async def test_control_needs_the_token_when_one_is_set(sglang: None, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    served = serve(tmp_path, monkeypatch, env={"PDTOP_TOKEN": "s3cret"})
    try:
        reader = await Client.open(served.url)
        await reader.wait(lambda c: bool(c.of("hello")))
        assert reader.of("hello")[0]["readonly"] is True
        reply = await reader.request({"cmd": "pin_level", "level": 2})
        assert not reply["ok"] and reply["error"]["field"] == "token"
        writer = await Client.open(served.url + "/?token=s3cret")
        assert (await ask(served, writer, {"cmd": "pin_level", "level": 2}))["ok"]
        assert served.tap.knobs.pinned_level == 2
        await reader.close()
        await writer.close()
    finally:
        served.thread.stop()
