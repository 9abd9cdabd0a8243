"""pdmux with `chunked_prefill_size` (newer SGLang's chunked prefill under PD multiplexing): a long prompt
prefilled chunk by chunk, each chunk layer-sliced on the prefill side, decode going on beside it."""
from __future__ import annotations

import pytest

from pdtop.engine.build import build_engine
from pdtop.engine.errors import ConfigError
from pdtop.engine.records import RoundRecord
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.roofline import cost
from pdtop.engine.scheduling.commands import Set
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, dump_pdmux_config, load_pdmux_config
from pdtop.engine.scheduling.splits import prefill_layers_per_step
from pdtop.engine.scheduling.tokens import generate

TEXT = ("The river runs past the old mill, under the stone bridge and out across the fields towards "
        "the sea, where the fishing boats wait for the tide. ")


def _chunk_rounds(rounds: list[RoundRecord], req_id: int) -> list:
    return [p for r in rounds for p in r.prefills if p.request_ids == [req_id]]


def test_chunked_layer_sliced_prefill_on_the_real_model_gives_generates_text(model_fp32, tokenizer):
    from pdtop.engine.runtime.runner import ModelRunner

    prompt = tokenizer.encode(TEXT * 20 + "Where does the river run?")
    assert 600 < len(prompt) < 1000
    short = tokenizer.encode("The history of")
    want = list(generate(ModelRunner(model_fp32, 2048), Request(0, list(prompt), SamplingParams(max_tokens=8))))
    want_short = list(generate(ModelRunner(model_fp32, 2048), Request(0, list(short), SamplingParams(max_tokens=24))))
    config = PdmuxConfig(split_forward_token_budget=2048, chunked_prefill_size=256)
    engine = build_engine("cpu", config=config, loaded_model=model_fp32, kv_capacity_tokens=2048)
    rounds: list[RoundRecord] = []
    engine.add_sink(lambda r: rounds.append(r) if isinstance(r, RoundRecord) else None)
    try:
        other = engine.submit(list(short), 24, ignore_eos=True)
        engine.step()
        req = engine.submit(list(prompt), 8)
        engine.run_until_idle(max_rounds=800)
        assert req.output_ids == want and other.output_ids == want_short  # decode undisturbed
    finally:
        engine.close()
    shown = _chunk_rounds(rounds, req.id)
    starts = sorted({p.tokens_done for p in shown})
    assert starts == [0, 256, 512]  # chunk by chunk: the tokens cached before each
    assert all(p.tokens == len(prompt) for p in shown)
    for done in starts:  # each chunk layer-sliced: 2048 // its tokens layers a slice, seen part way
        n = min(256, len(prompt) - done)
        mine = [p for p in shown if p.tokens_done == done]
        assert {p.layers_per_round for p in mine} == {prefill_layers_per_step(n, 30, 2048)}
        before, after = 30 * done // len(prompt), 30 * (done + n) // len(prompt)  # the prompt's share, in layers
        assert any(before < p.layers_done < after for p in mine)  # part way through this chunk's layers
    assert any(r.decode_bs and r.prefills and r.prefills[0].request_ids == [req.id] for r in rounds)


def _sim_run(config: PdmuxConfig, long: int = 8192, decoding: int = 8) -> tuple[Request, list[RoundRecord]]:
    engine = build_engine("sim:H100", config=config)
    for _ in range(decoding):
        engine.submit(engine.prompts.make(256), 2000, ignore_eos=True)
    engine.run_until_idle(max_rounds=decoding + 5)
    req = engine.submit(engine.prompts.make(long), 4, ignore_eos=True)
    rounds = []
    while not req.output_ids:
        rounds.append(engine.step())
        assert len(rounds) < 500
    return req, rounds


def test_sim_ttft_and_itl_are_the_rooflines():
    """8 requests decoding on an H100's 20 decode SMs beside 8192 tokens in 2048-token chunks, each chunk
    two slices (65536 // 2048 = 32 layers, then 4): a round is decode's roofline step; a slice is seen
    done at the end of the round it finishes in, the next one starts then, so each slice takes
    ceil(its roofline time on the 112 prefill SMs / step) rounds, and TTFT is those rounds."""
    size, budget = 2048, 65536
    req, rounds = _sim_run(PdmuxConfig(chunked_prefill_size=size, split_forward_token_budget=budget))
    sim = build_engine("sim:H100")
    engine_cfg, spec = sim.executor.cfg, sim.device.spec  # type: ignore[attr-defined]
    p_sms, d_sms = rounds[0].prefill_units, rounds[0].decode_units
    assert (p_sms, d_sms) == (112, 20)
    k = prefill_layers_per_step(size, 36, budget)
    assert k == 32
    alone = cost.decode_time(spec, cost.decode_bytes(engine_cfg, [256 + 13] * 8), d_sms)  # decode on its 20 SMs
    predicted_rounds = 0
    for start in range(0, 8192, size):
        for first, last in ((0, k), (k, 36)):
            flops = cost.prefill_layer_flops(engine_cfg, size, start, last - first)
            if last == 36:  # each chunk's head FLOPs, as the chunked policy's (the seed's convention)
                flops += cost.prefill_head_flops(engine_cfg, size)
            predicted_rounds += max(1, -(-cost.prefill_time(spec, flops, p_sms) // alone))
    assert len(rounds) == predicted_rounds == 22
    assert req.ttft == pytest.approx(predicted_rounds * alone, rel=0.01)
    itls = [r.decode_step_s for r in rounds if r.decode_bs]
    assert len(itls) == len(rounds) and max(itls) == pytest.approx(alone, rel=0.01)  # decode undisturbed
    shown = _chunk_rounds(rounds, req.id)
    assert sorted({p.tokens_done for p in shown}) == [0, 2048, 4096, 6144]
    prefill_flops = sum(r.flops for r in rounds) - sum(cost.decode_flops(engine_cfg, [269 + i] * 8)
                                                       for i in range(len(rounds)))
    assert prefill_flops == pytest.approx(cost.prefill_flops(engine_cfg, 8192), rel=1e-3)  # the whole prompt's


def test_off_by_default_and_sglangs_minus_one_is_off():
    _, rounds = _sim_run(PdmuxConfig())
    shown = [p for r in rounds for p in r.prefills]
    assert {p.tokens_done for p in shown} == {None} and {p.layers_per_round for p in shown} == {8}
    assert PdmuxConfig(chunked_prefill_size=-1).chunked_prefill_size == 0
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        PdmuxConfig(chunked_prefill_size=-2)
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        PdmuxConfig(chunked_prefill_size=True)


def test_the_file_key_round_trips_and_a_prompt_that_fits_goes_whole(tmp_path):
    path = tmp_path / "pdmux.yaml"
    path.write_text("chunked_prefill_size: 4096\n")
    config = load_pdmux_config(str(path))
    assert config.chunked_prefill_size == 4096
    assert "chunked_prefill_size: 4096" in dump_pdmux_config(config)
    assert "chunked_prefill_size" not in dump_pdmux_config(PdmuxConfig())
    _, rounds = _sim_run(config, long=4096)
    assert {p.tokens_done for r in rounds for p in r.prefills} == {None}  # fits one chunk: whole, as before


def test_set_live_takes_effect_for_the_next_prompt():
    engine = build_engine("sim:H100")
    engine.control(Set(chunked_prefill_size=1024))
    engine.step()
    assert engine.config.chunked_prefill_size == 1024
    req = engine.submit(engine.prompts.make(3000), 2, ignore_eos=True)
    seen = []
    while not req.output_ids:  # nothing decodes: each chunk's one slice (36 layers) ends in its round
        seen.append([p.tokens_done for p in engine.step().prefills])
    assert seen == [[1024], [2048], []]


def test_an_abort_during_a_chunk_ends_it_at_the_next_round_boundary_and_frees_its_kv():
    engine = build_engine("sim:H100", config=PdmuxConfig(chunked_prefill_size=2048))
    decoding = engine.submit(engine.prompts.make(100), 200, ignore_eos=True)
    engine.step()
    req = engine.submit(engine.prompts.make(8192), 10, ignore_eos=True)
    after = engine.submit(engine.prompts.make(300), 5, ignore_eos=True)
    pdmux = engine.scheduler.active
    while pdmux.batch is None or pdmux.batch.span != (2048, 2048):
        engine.step()
    engine.abort(req)  # in flight: its second chunk
    engine.step()
    assert not req.finished  # the slice in flight still writes its KV
    engine.run_until_idle(max_rounds=400)
    # the second chunk stops at the next round boundary (issue 27: an abandoned prefill does not run on),
    # so only the first chunk's tokens count as cached, and no later chunk ran
    assert (req.finish_reason, req.output_ids, req.num_cached) == ("abort", [], 2048)
    assert (after.finish_reason, len(after.output_ids)) == ("length", 5) and len(decoding.output_ids) == 200
    assert engine.executor.pool.used_tokens == 0 and engine.executor.pool.committed_blocks == 0
    assert not engine.scheduler.prefill_in_flight


def test_an_abort_between_two_chunks_ends_it_at_once():
    engine = build_engine("sim:H100", config=PdmuxConfig(chunked_prefill_size=2048))
    engine.submit(engine.prompts.make(100), 200, ignore_eos=True)
    engine.step()
    req = engine.submit(engine.prompts.make(8192), 10, ignore_eos=True)
    pdmux = engine.scheduler.active
    while not (pdmux.batch is None and pdmux.chunked is req):  # its first chunk done, the next not begun
        engine.step()
    assert req.num_cached == 2048
    engine.abort(req)
    engine.step()
    assert (req.finish_reason, req.num_cached) == ("abort", 2048) and pdmux.chunked is None
    assert pdmux.batch is None or req not in pdmux.batch.reqs


def test_once_nothing_decodes_the_layers_left_go_in_one_slice_on_a_gpu():
    """Newer SGLang's `_get_split_forward_count`: the budget's slices while decode runs, then, the decode
    batch empty, every layer left at once. (The CPU keeps slicing: test_scheduler_model.py.)"""
    engine = build_engine("sim:H100")
    short = engine.submit(engine.prompts.make(100), 4, ignore_eos=True)
    engine.step()
    req = engine.submit(engine.prompts.make(8192), 2, ignore_eos=True)
    rounds = []
    while not req.output_ids:
        rounds.append(engine.step())
    assert short.finished and short.token_times[-1] < req.token_times[0]
    assert {p.layers_per_round for r in rounds for p in r.prefills} == {8}  # slices of 8 beside decode
    alone = [r for r in rounds if not r.decode_bs]
    # then one round: the slice in flight (to 16) collected, the 20 layers left in one slice (not 3 of 8)
    assert rounds[-2].prefills[0].layers_done == 8 and len(alone) == 1 and alone[0] is rounds[-1]


@pytest.mark.parametrize("value", ["-5", "1.5", "true", "'2048'"])
def test_a_bad_size_in_a_file_is_one_line_and_exit_2(value, tmp_path, capsys):
    from pdtop.cli import main

    path = tmp_path / "pdmux.yaml"
    path.write_text(f"chunked_prefill_size: {value}\n")
    code = main(["levels", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "chunked_prefill_size" in err and "Traceback" not in err


def test_the_runner_refuses_a_chunk_that_is_not_one_requests_next_tokens(runner):
    r = runner()
    a, b = (Request(i, list(range(1, 65)), SamplingParams(max_tokens=2)) for i in (1, 2))
    for req in (a, b):
        r.admit(req)
    with pytest.raises(ValueError, match="one request"):
        r.prefill_begin([a, b], 16)
    with pytest.raises(ValueError, match="no chunk of 65 tokens"):
        r.prefill_begin([a], 65)
    state = r.prefill_begin([a], 48)
    r.prefill_layers(state, 0, r.config.num_layers)
    assert r.prefill_finish(state) == [] and a.num_cached == 48  # no token before the prompt's end
    state = r.prefill_begin([a], 16)
    r.prefill_layers(state, 0, r.config.num_layers)
    (first,) = r.prefill_finish(state)
    assert a.num_cached == 64 and first == r.prefill([b])[0]  # the same first token as the whole prompt


def test_prompts_that_fit_are_batched_whole_up_to_the_size():
    engine = build_engine("sim:H100", config=PdmuxConfig(chunked_prefill_size=1024))
    a, b, c = (engine.submit(engine.prompts.make(400), 2, ignore_eos=True) for _ in range(3))
    engine.run_until_idle(max_rounds=20)
    assert a.token_times[0] == b.token_times[0] < c.token_times[0]  # 800 of 1024 tokens, then 400
    unchunked = build_engine("sim:H100")
    a, b, c = (unchunked.submit(unchunked.prompts.make(400), 2, ignore_eos=True) for _ in range(3))
    unchunked.run_until_idle(max_rounds=20)
    assert a.token_times[0] == b.token_times[0] == c.token_times[0]  # up to 8,192 tokens a batch
