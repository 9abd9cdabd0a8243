"""What `pdtop record` receives from pdtop's plugin inside SGLang's scheduler: SGLang's own levels and
config in the hello, one round per scheduler round with the level SGLang's `adjust_stream_groups` chose
at each switch, its split prefill's layers, and the requests as the scheduler sees them."""
from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from pdtop.telemetry.decode import decode_event
from pdtop.telemetry.events import Hello
from pdtop.telemetry.recording.reader import read_recording

from .conftest import PDMUX_YAML, Served, serve
from .cpu_sglang import NUM_LAYERS, Req

ROOT = Path(__file__).resolve().parents[2]


def workload() -> list[tuple[int, list[Req]]]:
    """(round, arrivals): three 1,024-token prompts, then a 4,096-token prompt while they decode."""
    return [(0, [Req(f"a{i}", [7] * 1024, 6) for i in range(3)]), (5, [Req("long", [7] * 4096, 3)])]


async def run(served: Served, rounds: int, arrivals: list[tuple[int, list[Req]]]) -> None:
    """`rounds` rounds of SGLang's loop, the arrivals at their rounds."""
    done = 0
    for at, reqs in [*sorted(arrivals, key=lambda a: a[0]), (rounds, [])]:
        if at > done:
            await asyncio.to_thread(served.thread.rounds, at - done)
            done = at
        served.thread.inbox.extend(reqs)


def compress(levels: list[int]) -> list[int]:
    return [x for i, x in enumerate(levels) if i == 0 or x != levels[i - 1]]


async def record(served: Served, path: Path, body) -> None:  # type: ignore[no-untyped-def]
    """`pdtop record` (a subprocess) on the plugin's server while `body()` runs."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pdtop", "record", served.url, "-o", str(path),
                                                cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
        assert b"recording to" in line, line
        await body()
        await asyncio.sleep(0.5)  # the server's ticks and the recorder's flush
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0, await proc.stderr.read()  # type: ignore[union-attr]


async def test_record_gets_sglangs_levels_config_and_choice_at_each_switch(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "sglang.ndjson"
    await record(served, path, lambda: run(served, 40, workload()))
    rec = read_recording(path)
    assert not rec.problems
    hello = decode_event(rec.hello)
    assert isinstance(hello, Hello) and hello.engine is not None
    engine = hello.engine
    sm_counts = served.scheduler.sm_counts
    assert [tuple(x) for x in engine.levels] == [tuple(x) for x in sm_counts] and len(sm_counts) == 8
    assert sm_counts[0] == (132, 0) and sm_counts[-1] == (0, 132)  # SGLang's whole-device ends, divide_sm between
    assert engine.units == 132 and engine.unit_name == "SMs" and engine.policy == "pdmux"
    assert engine.num_layers == NUM_LAYERS
    assert engine.runtime is not None and engine.runtime["server"] == "SGLang 0.5.23"
    config = engine.config
    assert (config.sm_group_num, config.decode_bs_divisor, config.split_forward_token_budget) == (8, 4, 8192)
    assert config.manual_divisions == [] and config.pinned_level is None and config.policy == "pdmux"

    rounds = [decode_event(e) for _, e in rec if e["type"] == "round"]
    assert [r.index for r in rounds] == list(range(rounds[0].index, rounds[0].index + len(rounds)))
    # the level in force each round, as SGLang chose it at its switch points
    assert compress([r.level for r in rounds]) == compress([0, *served.switches])
    assert 4 in served.switches  # 3 decoding, divisor 4, 6 split levels: 3 * 6 // 4
    for r in rounds:
        assert (r.prefill_units, r.decode_units) == tuple(sm_counts[r.level]) and not r.pinned
    # the split prefills, slice by slice: budget 8192 // 3072 tokens = 2 layers, // 4096 = 2 layers
    first = [r.prefills[0] for r in rounds if r.prefills and len(r.prefills[0].request_ids) == 3]
    long = [r.prefills[0] for r in rounds if r.prefills and r.prefills[0].tokens == 4096]
    assert [p.layers_done for p in first] == list(range(0, NUM_LAYERS, 2))
    assert [p.layers_done for p in long] == list(range(0, NUM_LAYERS, 2))
    assert all(p.layers_per_round == 2 and p.layers_total == NUM_LAYERS for p in first + long)
    assert first[0].tokens == 3 * 1024
    # decode rounds: the batch, the tokens it sampled, and the round's wall time as the step's
    decoding = [r for r in rounds if r.decode_bs > 0]
    assert {r.decode_bs for r in decoding} == {3, 1}
    assert all(r.tokens_emitted >= r.decode_bs and r.round_s > 0 and r.decode_step_s > 0 for r in decoding)
    # KV as SGLang's `token usage` counts it (its allocator's free slots and the radix cache)
    assert {r.kv_capacity_tokens for r in rounds} == {100_000}
    assert max(r.kv_used_tokens for r in rounds) >= 3 * 1024 + 4096
    # requests as the scheduler saw them: each arrival, its first token, its finish
    requests = [decode_event(e) for _, e in rec if e["type"] == "request"]
    kinds = {k: [r for r in requests if r.kind == k] for k in ("arrival", "first_token", "finish")}
    assert [len(v) for v in kinds.values()] == [4, 4, 4]
    assert sorted(r.prompt_tokens for r in kinds["arrival"]) == [1024, 1024, 1024, 4096]
    assert sorted(r.output_tokens for r in kinds["finish"]) == [3, 6, 6, 6]
    assert all(r.finish_reason == "length" and r.ttft_s is not None and r.ttft_s > 0 for r in kinds["finish"])
    assert {r.request_id for r in kinds["arrival"]} == {r.request_id for r in kinds["finish"]}
    assert set(first[0].request_ids) <= {r.request_id for r in kinds["arrival"]}


async def test_sglang_without_pdmux_has_rounds_and_no_split(sglang: None, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    served = serve(tmp_path, monkeypatch, pdmux_yaml=None)  # SGLang's event_loop_normal
    try:
        path = tmp_path / "normal.ndjson"
        await record(served, path, lambda: run(served, 12, [(0, [Req("a", [7] * 512, 4), Req("b", [7] * 256, 4)])]))
    finally:
        served.thread.stop()
    rec = read_recording(path)
    engine = decode_event(rec.hello).engine  # type: ignore[union-attr]
    assert engine.policy == "chunked" and len(engine.levels) == 1 and engine.runtime["pdmux"] is False
    rounds = [decode_event(e) for _, e in rec if e["type"] == "round"]
    assert all(r.level == 0 and r.policy == "chunked" for r in rounds)
    prefill = [r for r in rounds if r.prefills]
    assert len(prefill) == 1 and prefill[0].prefills[0].tokens == 768 and prefill[0].decode_bs == 0
    assert [r.decode_bs for r in rounds if r.decode_bs] == [2, 2, 2]  # 4 tokens: the first at the prefill


def test_plugin_off_hooks_nothing(sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed but not enabled: SGLang's methods are its own objects, so their results and timing are."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.multiplex.multiplexing_mixin import SchedulerMultiplexMixin
    from sglang.srt.plugins import load_plugins

    from pdtop.sglang_plugin import entry

    before = {name: SchedulerMultiplexMixin.__dict__[name] for name in ("init_pdmux", "adjust_stream_groups")}
    before |= {name: Scheduler.__dict__[name] for name in ("process_input_requests", "run_batch",
                                                           "process_batch_result", "set_internal_state")}
    monkeypatch.delenv("PDTOP_SGLANG_PORT", raising=False)
    load_plugins()
    assert entry.installed is None
    owners = {"init_pdmux": SchedulerMultiplexMixin, "adjust_stream_groups": SchedulerMultiplexMixin}
    for name, fn in before.items():
        assert owners.get(name, Scheduler).__dict__[name] is fn, name
    assert PDMUX_YAML  # the same SGLang as the other tests, only not enabled
