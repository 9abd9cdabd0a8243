"""The engine's layer trace (`Executor.set_layer_trace`, `ModelRunner.layer_trace`) on real rounds of the
real model on the CPU device: each layer's attention and MLP told once per pass, with the work they ran
for, on the side that ran them; off by default, and off again when unset."""
from __future__ import annotations

import itertools
import threading

from pdtop.bench.round_trace import RoundTracer
from pdtop.engine.build import build_engine
from pdtop.engine.engine import Engine
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig

Event = tuple[str, str, int, float, float, str]  # work, phase, layer, start, end, thread name


def _trace(engine: Engine) -> list[Event]:
    events: list[Event] = []

    def told(work: str, phase: str, layer: int, start: float, end: float) -> None:
        events.append((work, phase, layer, start, end, threading.current_thread().name))

    assert engine.executor.set_layer_trace(told) is True
    return events


def _passes(events: list[Event], layers: int) -> list[list[tuple[str, int]]]:
    """(phase, layer) of the events, cut into passes of `layers` layers."""
    seq = [(phase, layer) for _, phase, layer, *_ in events]
    return [seq[i:i + 2 * layers] for i in range(0, len(seq), 2 * layers)]


def _run(model, tokenizer, policy: str, trace: bool) -> tuple[list[list[int]], list[Event]]:
    """A request decoding, then a 700-token prompt arriving beside it (traced from its arrival to its
    first token, when asked), then two more rounds with the trace unset."""
    config = PdmuxConfig(split_forward_token_budget=2048, chunk_size=256)  # pdmux: 2 layers a slice
    engine = build_engine("cpu", policy=policy, config=config, loaded_model=model)
    try:
        runner = engine.executor
        assert runner.layer_trace is None  # off unless asked
        short = engine.submit(tokenizer.encode("Hello"), 30, ignore_eos=True)
        while not short.token_times:
            engine.step()
        events = _trace(engine) if trace else []
        long = engine.submit(engine.prompts.make(700), 2, ignore_eos=True)
        while not long.token_times:
            engine.step()
        assert not engine.scheduler.prefill_in_flight  # nothing in flight: every layer told has been told
        engine.executor.set_layer_trace(None)
        assert runner.layer_trace is None
        told = len(events)
        engine.step()
        engine.step()
        assert len(events) == told  # unset: nothing more
        return [short.output_ids, long.output_ids], events
    finally:
        engine.close()


def test_pdmux_rounds_tell_every_layer_of_each_side(model_fp32, tokenizer):
    layers = model_fp32.config.num_layers
    tokens, events = _run(model_fp32, tokenizer, "pdmux", trace=True)
    assert _run(model_fp32, tokenizer, "pdmux", trace=False)[0] == tokens  # tracing changes no token
    prefill = [e for e in events if e[0] == "prefill"]
    decode = [e for e in events if e[0] == "decode"]
    assert {e[0] for e in events} == {"prefill", "decode"}
    one_pass = [(phase, layer) for layer in range(layers) for phase in ("attn", "mlp")]
    # the prompt's prefill: every layer once, attention then MLP, in order, on the prefill side's worker
    assert _passes(prefill, layers) == [one_pass]
    assert {name.split("_")[0] for *_, name in prefill} == {"pdtop-prefill"}
    # every decode step beside it: a whole pass, on the decode side's worker
    assert len(decode) >= 2 * 2 * layers and all(p == one_pass for p in _passes(decode, layers))
    assert {name.split("_")[0] for *_, name in decode} == {"pdtop-decode"}
    for side in (prefill, decode):  # each side's phases end after they start, one after another
        assert all(start <= end for _, _, _, start, end, _ in side)
        assert all(a[4] <= b[3] for a, b in itertools.pairwise(side))


def test_chunked_steps_tell_mixed_work(model_fp32, tokenizer):
    layers = model_fp32.config.num_layers
    _, events = _run(model_fp32, tokenizer, "chunked", trace=True)
    one_pass = [(phase, layer) for layer in range(layers) for phase in ("attn", "mlp")]
    mixed = [e for e in events if e[0] == "mixed"]
    # 700 prompt tokens in 256-token chunks, each one forward with the decode row: 3 passes
    assert _passes(mixed, layers) == [one_pass] * 3
    assert {e[0] for e in events} <= {"mixed", "decode"}  # no layer-split prefill under chunked
    assert {name.split("_")[0] for *_, name in events} == {"pdtop-decode"}  # every step on the whole device


def test_round_tracer_uses_the_trace_and_unsets_it(model_fp32):
    engine = build_engine("cpu", loaded_model=model_fp32)
    try:
        tracer = RoundTracer(engine)
        assert engine.executor.layer_trace is not None
        tracer.close()
        assert engine.executor.layer_trace is None
    finally:
        engine.close()


def test_the_simulator_has_no_layers_to_tell():
    engine = build_engine("sim:H100")
    try:
        assert engine.executor.set_layer_trace(lambda *_: None) is False
        RoundTracer(engine).close()  # --trace on a simulated device: no layer times, nothing breaks
    finally:
        engine.close()
