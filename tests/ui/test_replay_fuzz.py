"""The dashboard replays a recording fuzzed with wrong types and NaN/inf (in events and in
line times) to its end without failing; the replay bar says what could not be read."""
from __future__ import annotations

import copy
import json
import random

import pytest

from pdtop.telemetry.sources.replay import ReplaySource
from pdtop.ui.app import PdtopApp
from pdtop.ui.widgets.replay_bar import ReplayBar

from .conftest import record_engine

WRONG = ["x", "3", None, [], {}, True, [[1]], {"a": 1}, float("nan"), float("inf"), float("-inf")]


def _mutate(event: dict, rng: random.Random) -> dict:
    """One field, at the top or inside a nested object, replaced by a wrong value."""
    event = copy.deepcopy(event)
    target = event
    for _ in range(rng.randrange(3)):
        inner = [v for v in target.values() if isinstance(v, dict)]
        inner += [v[0] for v in target.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if not inner:
            break
        target = rng.choice(inner)
    keys = [k for k in target if k != "type"]
    if keys:
        target[rng.choice(keys)] = rng.choice(WRONG)
    return event


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "clean.ndjson"
    return record_engine(path, 600, rate=12.0, controls={100: {"cmd": "set", "decode_bs_divisor": 12}})


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_fuzzed_recording_replays_to_the_end_and_the_bar_counts_what_was_lost(clean, tmp_path, seed, until):
    rng = random.Random(seed)
    header, *lines = clean.read_text().splitlines()
    hello = json.loads(header)["hello"]
    out = [header]
    for line in lines:
        obj = json.loads(line)
        r = rng.random()
        if r < 0.15:
            obj["event"] = _mutate(obj["event"], rng)
        elif r < 0.17:
            obj["t"] = rng.choice([float("inf"), float("nan"), float("-inf"), "x", None])
        elif r < 0.18:
            obj["event"] = _mutate(hello, rng)
        elif r < 0.19:
            obj["event"]["v"] = 2
        out.append(json.dumps(obj))
    path = tmp_path / "fuzzed.ndjson"
    path.write_text("\n".join(out) + '\n{"t": 9, "event": {"ty')
    src = ReplaySource(path, speed=16)
    app = PdtopApp(src)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: src.at_end, "the end of the recording")
        src.seek(src.duration / 2)
        await until(pilot, lambda: app.state.rounds_seen > 300, "rounds after the seek")
        app.repaint()
        bar = str(app.query_one(ReplayBar).render())
        assert app.source_error is None and app.state.invalid > 0
        assert "unreadable lines skipped" in bar and "last line cut off" in bar
        assert "protocol v2 (this pdtop reads v1)" in bar
