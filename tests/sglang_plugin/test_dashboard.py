"""pdtop's dashboard on the plugin's stream, driven by Pilot while SGLang's real pdmux loop runs: the split
at SGLang's level, the decode batch's ITL, the split prefill's progress, and the control keys steering
SGLang (a pin, back to automatic, the divisor) or refused in words (what SGLang fixes at start)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp

from .conftest import Served, serve
from .cpu_sglang import Req

SIZE = (130, 40)


async def until(pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.05)


@contextlib.asynccontextmanager
async def paced(served: Served, every_s: float = 0.02) -> AsyncIterator[None]:
    """SGLang's loop runs a round every `every_s` while the app runs."""
    async def pace() -> None:
        while True:
            await asyncio.to_thread(served.thread.rounds, 1)
            await asyncio.sleep(every_s)

    task = asyncio.create_task(pace())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def text(app: PdtopApp, panel: str) -> str:
    app.repaint()
    return " ".join(t.plain for t in app.query_one(panel)._last_texts)


async def answer(pilot: Any, key: str, value: str) -> None:
    await pilot.press(key)
    await until(pilot, lambda: len(pilot.app.screen_stack) == 2, f"the prompt of {key!r}")
    pilot.app.screen.query_one(Input).value = value
    await pilot.press("enter")


async def test_the_dashboard_shows_and_steers_sglangs_split(served: Served) -> None:
    app = PdtopApp(LiveSource(served.url))
    inbox = served.thread.inbox
    async with app.run_test(size=SIZE) as pilot, paced(served):
        inbox.extend(Req(f"d{i}", [5] * 256, 100_000) for i in range(3))
        await until(pilot, lambda: app.connection == "live" and app.state.decode_bs == 3, "three decoding")
        assert "│ SGLang │" in app.query_one("HeaderBar").text  # its short form at 130 columns
        inbox.append(Req("p1", [5] * 2048, 2))
        await until(pilot, lambda: app.state.level == 4 and app.state.prefills, "SGLang's level 4, a prefill")
        split = text(app, "SplitPanel")
        assert "level 4/7" in split and "auto" in split and "prefill 88 SMs" in split and "decode 44 SMs" in split
        prefill = app.state.prefills[0]
        assert prefill.layers_total == 28 and prefill.layers_per_round == 4 and prefill.tokens == 2048
        shown = text(app, "PrefillPanel")
        assert "2.0k tok" in shown and "/28" in shown and "layers 4/rnd" in shown and "ETA" in shown
        await until(pilot, lambda: len(app.state.itls) > 10, "the decode batch's ITL")
        assert all(0 < gap < 5 for gap in app.state.itls)

        await pilot.press("minus")  # level down from SGLang's 4: pins 3
        await until(pilot, lambda: served.tap.knobs.pinned_level == 3, "the pin reached SGLang's scheduler")
        await until(pilot, lambda: not app.state.prefills, "the prefill done")
        inbox.append(Req("p2", [5] * 2048, 2))
        await until(pilot, lambda: app.state.level == 3 and app.state.pinned and app.state.prefills,
                    "SGLang's adjust_stream_groups returned the pinned level")
        assert served.switches[-1] == 3 and "pinned" in text(app, "SplitPanel")
        await pilot.press("a")
        await until(pilot, lambda: served.tap.knobs.pinned_level is None and not app.state.pinned, "automatic")
        await answer(pilot, "d", "6")
        await until(pilot, lambda: served.scheduler.pdmux_config.decode_bs_divisor == 6, "divisor 6 in SGLang")
        await until(pilot, lambda: app.state.config is not None and app.state.config.decode_bs_divisor == 6,
                    "the dashboard saw the divisor")
        await answer(pilot, "c", "512")  # SGLang's --chunked-prefill-size is fixed at start
        await until(pilot, lambda: any(n[1] == "refused" for n in app.notices), "the refusal")
        refusal = next(n for n in app.notices if n[1] == "refused")
        assert "fixed at start" in refusal[2]
        assert served.scheduler.pdmux_config.decode_bs_divisor == 6


async def test_sglang_without_pdmux_reads_so(sglang: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = serve(tmp_path, monkeypatch, pdmux_yaml=None)
    app = PdtopApp(LiveSource(served.url))
    try:
        async with app.run_test(size=SIZE) as pilot, paced(served):
            served.thread.inbox.extend(Req(f"d{i}", [5] * 256, 100_000) for i in range(2))
            await until(pilot, lambda: app.state.decode_bs == 2, "two decoding")
            split = text(app, "SplitPanel")
            assert "SGLang, no pdmux" in split and "--enable-pdmux" in split and "level 0/" not in split
            assert "workload" not in split and "rate" not in split  # SGLang's requests come from its clients
            await pilot.press("a")  # automatic level choice: SGLang has none to make here
            await until(pilot, lambda: any(n[1] == "refused" for n in app.notices), "the refusal")
            assert "without --enable-pdmux" in next(n for n in app.notices if n[1] == "refused")[2]
    finally:
        served.thread.stop()
