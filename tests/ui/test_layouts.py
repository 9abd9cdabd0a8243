"""80x24, 120x30 and 160x48: every panel fits and says something, the header keeps every item, the
footer keeps `? help` and `q quit` (from 120 columns, every key), and nothing is drawn outside the panels.
Also the header and status line of what `pdtop` starts on a laptop: cpu, the real model, the API."""
from __future__ import annotations

import itertools

import pytest
from rich.text import Text

from pdtop.engine.build import build_engine
from pdtop.engine.scheduling.workload import demo_workload
from pdtop.telemetry.sources.live import LiveSource
from pdtop.ui.app import PdtopApp
from pdtop.ui.widgets.base import Panel
from pdtop.ui.widgets.header import short_weights

from .conftest import EngineServer, play_busy


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (160, 48)])
async def test_every_panel_fits(busy, size):
    width, _height = size
    app = PdtopApp(LiveSource(busy.url, token=busy.token), slo_ms=12)
    async with app.run_test(size=size) as pilot:
        await play_busy(pilot, app, busy.engine)
        app.repaint()
        await pilot.pause()
        header = app.query_one("HeaderBar").text
        assert len(header) <= width - 2
        for item in ("● live", "H100", "qwen3-8b", "pdmux", "rec", "dropped 0"):
            assert item in header, (item, header)
        assert len(app.query_one("StatusLine").text) <= width - 2
        shown = [p for p in app.query(Panel) if p.display]
        assert {p.id for p in shown} >= {"split", "requests", "steps", "bandwidth", "timeline"}
        bottom = 0
        for panel in shown:
            inner = panel.content_size.width
            lines = [t for t in panel._last_texts if isinstance(t, Text)]
            assert any(t.plain.strip() for t in lines), f"{panel.id} is empty"
            assert len(lines) <= panel.content_size.height, f"{panel.id}: more lines than rows"
            for line in lines:
                assert line.cell_len <= inner, f"{panel.id} cut at {inner}: {line.plain!r}"
            for edge in (str(panel.border_title or ""), str(panel.border_subtitle or "")):
                assert len(edge) <= panel.outer_size.width - 4, f"{panel.id} border cut: {edge!r}"
            bottom = max(bottom, panel.region.bottom)
        footer = app.query_one("Footer")
        assert bottom <= footer.region.y  # nothing under the footer, no scrolling screen
        keys = {k.action: k.region for k in app.screen.query("FooterKey")}
        for command in ("help", "quit"):
            region = keys[f"run_command('{command}')"]
            assert region.right <= width, command
        if width >= 120:  # every key whole: inside the screen and none drawn over another
            shown_keys = sorted((r for r in keys.values() if r.width), key=lambda r: r.x)
            assert all(r.right <= width for r in shown_keys), keys
            assert all(a.right <= b.x for a, b in itertools.pairwise(shown_keys)), keys
        steps = app.query_one("StepTimePanel")
        assert steps.content_size.height >= 5  # at least 4 chart rows and the marks
        lanes = [t.plain for t in app.query_one("TimelinePanel")._last_texts]
        assert any(lane.startswith("prefill") and "#" in lane for lane in lanes), lanes  # a prefill's ids


@pytest.mark.parametrize("size", [(80, 24), (120, 30)])
async def test_the_default_start_fits_the_header_and_status_line(model_fp32, until, size):
    """`pdtop` on a machine without a GPU: the model's real name, the device, and the workload in words,
    none of them cut; the API's address where there is room."""
    width, _height = size
    engine = build_engine("cpu", loaded_model=model_fp32, workload=demo_workload("cpu"))
    es = EngineServer(engine, manual=True).start()
    es.server.api_url = "http://127.0.0.1:40375/v1"
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.connection == "live", "connected")
            for _ in range(3):
                engine.step()
            await until(pilot, lambda: app.state.round_index >= 2, "three rounds")
            app.repaint()
            await pilot.pause()
            header, status = app.query_one("HeaderBar").text, app.query_one("StatusLine").text
            assert len(header) <= width - 2 and len(status) <= width - 2
            for item in ("● live", "cpu", "SmolLM2-135M-Instruct", "pdmux", "rec", "dropped 0"):
                assert item in header, (item, header)
            assert ("api " in header) == (width >= 120), header
            assert "…" not in header + status, (header, status)
            assert "1024-token prompts every 5 s; seed 0" in status, status
            split = [t.plain for t in app.query_one("SplitPanel")._last_texts]
            assert any("decode" in line for line in split) and not any("…" in line for line in split), split
    finally:
        es.close()


@pytest.fixture(scope="module")
def model_default():
    """The shipped model as `pdtop` loads it on the CPU by default (gguf where the kernels build here)."""
    from pdtop.engine.build import load_for

    return load_for("cpu")


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (160, 48)])
async def test_the_header_says_what_the_matmuls_run_on(model_default, until, size):
    """From 120 columns the header names the weights path (`gguf Q4_1+Q8_0 (avx512-vnni)`, short `gguf
    avx512-vnni`); at 80 there is no room beside the model's whole name, so it goes as the API item does."""
    width, _height = size
    engine = build_engine("cpu", loaded_model=model_default, workload=demo_workload("cpu"))
    es = EngineServer(engine, manual=True).start()
    try:
        app = PdtopApp(LiveSource(es.url, token=es.token))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.connection == "live", "connected")
            engine.step()
            await until(pilot, lambda: bool(app.state.info.weights), "described")
            app.repaint()
            await pilot.pause()
            header, weights = app.query_one("HeaderBar").text, model_default.weights
            items = [item.strip() for item in header.split("│")]
            assert len(header) <= width - 2 and "SmolLM2-135M-Instruct" in header and "…" not in header, header
            if width >= 160:
                assert weights in items, (weights, header)
            elif width >= 120:
                assert short_weights(weights) in items, (weights, header)
            else:
                assert not any(weights.startswith(item) for item in items[3:]), header  # not half of it either
    finally:
        es.close()


def test_the_short_weights_name_the_kernel_path():
    assert short_weights("gguf Q4_1+Q8_0 (avx512-vnni)") == "gguf avx512-vnni"
    assert short_weights("float32") == "float32"


async def test_a_two_digit_batch_keeps_the_kv_percentage_whole_at_80x24(busy):
    """At 80x24 the KV row joins the requests line; three-digit counts still leave its percentage whole."""
    app = PdtopApp(LiveSource(busy.url, token=busy.token), slo_ms=12)
    async with app.run_test(size=(80, 24)) as pilot:
        await play_busy(pilot, app, busy.engine)
        state = app.state
        state.running, state.waiting, state.decode_bs = 128, 345, 128
        state.kv_used = int(state.kv_capacity * 0.31)
        panel = app.query_one("RequestsPanel")
        lines = panel.render_state(state).renderables
        assert all(t.cell_len <= panel.inner_width for t in lines), [t.plain for t in lines]
        assert "KV 31%" in lines[0].plain and "128" in lines[0].plain, lines[0].plain
