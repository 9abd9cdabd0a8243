"""A recording with bad events replays without failing: the reader refuses non-finite
times (the line is skipped and counted), the dashboard's state model refuses events of a
wrong type or with NaN/inf (counted, nothing else changes), and what could not be read is
listed for the replay bar, with events of a protocol version this pdtop does not know."""
from __future__ import annotations

import json

from pdtop.engine.records import ConfigChange
from pdtop.telemetry import encode
from pdtop.telemetry.events import ConfigEvent
from pdtop.telemetry.recording.reader import read_recording
from pdtop.telemetry.recording.recorder import Recorder
from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.state import DashboardState

from ..conftest import hello_event, make_engine

HELLO = hello_event()


def real_events(rounds: int) -> list[dict]:
    engine = make_engine()
    out: list[dict] = []

    def sink(r) -> None:
        out.append(json.loads(encode.encode(ConfigEvent.after(r, engine.config_record())
                                            if isinstance(r, ConfigChange) else r)))

    engine.add_sink(sink)
    try:
        for _ in range(rounds):
            engine.step()
    finally:
        engine.close()
    return out


def bad_events(good: list[dict]) -> list[dict]:
    """The issue's examples: each stopped playback or crashed the dashboard."""
    a_round = next(e for e in good if e["type"] == "round")
    return [
        {"type": "dropped", "v": 1, "count": "x"},
        {**a_round, "prefills": 5},
        {**a_round, "decode_bs": None},
        {**HELLO, "engine": {**HELLO["engine"], "levels": "x"}},
        {**a_round, "time": float("nan")},
        {**a_round, "round_s": float("inf")},
        {**a_round, "v": 2},
    ]


def write(path, good: list[dict], bad: list[dict]) -> None:
    rec = Recorder(path, HELLO)
    for i, event in enumerate(good):
        rec.write(json.dumps(event), t=i * 0.001)
        if i % 10 == 5 and bad:
            rec.write(json.dumps(bad.pop()), t=i * 0.001)  # json writes NaN and Infinity as they come
    rec.close()
    with open(path, "a") as f:
        f.write('{"t": Infinity, "event": {"type": "round", "v": 1}}\n')
        f.write('{"t": NaN, "event": {"type": "round", "v": 1}}\n')
        f.write('{"t": 1, "event": ' + "[" * 5000 + "]" * 5000 + "}\n")
        f.write('{"t": 0.2, "event": {"type": "rou')


async def test_bad_events_are_refused_and_counted_and_playback_goes_on(tmp_path):
    good = real_events(60)
    path = tmp_path / "bad.ndjson"
    write(path, good, bad_events(good))
    rec = read_recording(path)
    assert rec.skipped == 3 and rec.truncated and rec.duration < 1  # no infinite time
    assert rec.problems == ["3 unreadable lines skipped", "last line cut off",
                            "1 event of protocol v2 (this pdtop reads v1)"]
    src = ReplaySource(path, speed=16, hold_at_end=False)
    state = DashboardState()
    async for event in src.events():
        state.ingest(event)
    assert src.at_end
    assert state.invalid == 7  # each bad event refused, the rest taken
    assert state.rounds_seen == sum(e["type"] == "round" for e in good)
    assert state.dropped == 0 and all(p.time == p.time and p.round_s < 1 for p in state.rounds)  # no NaN, no inf
    src.seek(rec.duration / 2)  # the configuration in force there, from the readable events
    replayed = [e async for e in src.events()]
    assert [e["type"] for e in replayed[:2]] == ["hello", "seek"]
    assert replayed[1]["config"] == HELLO["engine"]["config"]
