"""The Llama model on the real SmolLM2 weights: reference output, batching, layer splits, dtypes,
synthetic models; on CUDA, the reference answer (the GGUF) and a synthetic model against the CPU
(what the lent GPU machine, without gguf or the model file, runs).

The loader is imported where it is used: it needs gguf, which the GPU machine lacks."""
from __future__ import annotations

import pytest
import torch
from chat_prompts import chat_ids, prompt_logits
from warm_start import prefill_to_decoding

from pdtop.engine.errors import EngineError
from pdtop.engine.model.llama import REFINE_TOP, ForwardBatch, Segment
from pdtop.engine.model.synthetic import synthetic_model
from pdtop.engine.request import Request, SamplingParams
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import append_token, generate

# Batched and lone runs use different matmul row counts, so oneDNN may sum in another order:
# logits (magnitude ~10-30) may differ by float32 rounding, never by more than this.
LOGIT_ATOL = 1e-3


def greedy(runner, ids: list[int], max_tokens: int = 32) -> list[int]:
    return list(generate(runner, Request(0, ids, SamplingParams(max_tokens=max_tokens))))


def test_reference_answer(runner, tokenizer, model_fp32):
    out = greedy(runner(), chat_ids(tokenizer, "What is the capital of France?"))
    assert out[-1] in model_fp32.config.eos_ids
    assert tokenizer.decode(out[:-1]) == "The capital of France is Paris."


def test_layer_ranges_compose(model_fp32, tokenizer):
    """embed -> layers [0, a) -> [a, b) -> [b, L) -> logits equals one pass over [0, L)."""
    ids = chat_ids(tokenizer, "Name three colours of the rainbow.")
    L = model_fp32.num_layers

    whole = prompt_logits(model_fp32, ids, [])
    for cuts in ([1], [5, 17], list(range(1, L))):
        assert torch.equal(prompt_logits(model_fp32, ids, cuts), whole)


def test_bfloat16_model_agrees_with_float32(gguf_path, tokenizer, model_fp32):
    """bfloat16 keeps in float32 what llama.cpp does: the residual stream from the embedding to the
    final norm, and the leading logits (float32 sums of the final norm's float32 output with the
    bfloat16 weights). What agreement on text and logits means is tests/engine/model/test_bfloat16.py."""
    from pdtop.engine.model.loader import load_model

    bf16 = load_model(gguf_path, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16 and bf16.dtype_bytes == 2
    assert bf16.norm.weight_f32.dtype == torch.float32 and bf16.decoder_layers[0].attn_norm.out_dtype == torch.bfloat16
    ids = chat_ids(tokenizer, "What is the capital of France?")
    logits, last = {}, {}
    for name, m in (("bf16", bf16), ("fp32", model_fp32)):
        r = ModelRunner(m, kv_capacity_tokens=256)
        seq = Request(0, ids)
        r.admit(seq)
        slots = torch.as_tensor(r.kv.slots(seq.table, 0, len(ids)))
        batch = ForwardBatch(kv=r.kv, positions=torch.arange(len(ids)), slots=slots,
                             segments=[Segment(offset=0, length=len(ids), prefix=0)])
        with torch.inference_mode():
            h = m.embed(torch.tensor(ids))
            assert h.dtype == torch.float32
            h = m.forward_layers(h, batch, 0, m.num_layers)
            assert h.dtype == torch.float32
            last[name], logits[name] = h[-1:], m.logits(h[-1:])[0]
    assert logits["bf16"].dtype == torch.float32
    with torch.inference_mode():
        x = bf16.norm.forward(last["bf16"])
        head = bf16.lm_head.forward(x.to(bf16.dtype)).float()[0]  # before the refinement
    # the rows refined are bfloat16's leading ones (after refinement an unrefined tail logit may rank
    # among them: seen with AMX's bfloat16 rounding)
    top = head.topk(REFINE_TOP).indices
    exact = bf16.embed_weight[top].float() @ x[0]  # tied LM head: the embedding's rows
    assert torch.allclose(logits["bf16"][top], exact, rtol=1e-5, atol=1e-4)
    ref = logits["fp32"]
    lead = ref.topk(10).indices
    assert float((logits["bf16"][lead] - ref[lead]).abs().max()) < 0.25
    # the top two are 0.08 apart in float32: bfloat16 must pick float32's token or one within 0.15 of it
    assert float(ref.max() - ref[logits["bf16"].argmax()]) < 0.15


def test_synthetic_qwen3_8b_two_layers_on_cpu():
    """The 8B shapes with 2 layers (about 3.3 GB in bfloat16): builds, runs, stays finite."""
    m = synthetic_model("synthetic:qwen3-8b", dtype="bfloat16", num_layers=2)
    cfg = m.config
    assert (cfg.num_layers, cfg.hidden, cfg.vocab, cfg.qk_norm) == (2, 4096, 151936, True)
    r = ModelRunner(m, kv_capacity_tokens=128)
    seqs = [Request(n, list(range(100, 100 + n)), SamplingParams(max_tokens=3, ignore_eos=True)) for n in (9, 20)]
    for s in seqs:
        r.admit(s)

    def take(tokens: list[int]) -> None:
        for s, t in zip(seqs, tokens, strict=True):
            append_token(s, t, 0.0, cfg.eos_ids)

    state = r.prefill_begin(seqs)
    r.prefill_layers(state, 0, 1)
    r.prefill_layers(state, 1, 2)
    take(r.prefill_finish(state))
    assert torch.isfinite(state.logits).all() and state.logits.std() > 0
    take(r.decode(seqs))
    toks, first = r.chunk_step(seqs, None, 0)
    take(toks)
    assert all(s.finished and len(s.output_ids) == 3 for s in seqs) and first is None
    assert all(0 <= t < cfg.vocab for s in seqs for t in s.output_ids)
    del m, r


def test_synthetic_models_are_seeded():
    a = synthetic_model("synthetic:smollm2-135m", dtype="float32", num_layers=1, seed=1)
    b = synthetic_model("synthetic:smollm2-135m", dtype="float32", num_layers=1, seed=1)
    c = synthetic_model("synthetic:smollm2-135m", dtype="float32", num_layers=1, seed=2)
    assert torch.equal(a.embed_weight, b.embed_weight) and not torch.equal(a.embed_weight, c.embed_weight)
    std = float(a.embed_weight.std())
    assert 0.015 < std < 0.025


def test_synthetic_8b_refused_when_it_cannot_fit():
    psutil = pytest.importorskip("psutil")  # imported here: a collection error would stop every test of the run
    need = 8.2e9 * 4  # float32 bytes of 36 layers + embeddings
    if psutil.virtual_memory().available > need / 0.9:
        pytest.skip("this machine could hold a float32 8B model")
    with pytest.raises(EngineError, match=r"needs .* GiB .* only .* GiB free"):
        synthetic_model("synthetic:qwen3-8b", dtype="float32")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_reference_answer_on_cuda():
    """The real weights; skipped where gguf or the model file is missing (the lent GPU machine)."""
    pytest.importorskip("gguf")
    from pdtop.engine.errors import ModelFileError
    from pdtop.engine.model.loader import default_model_path, load_model
    from pdtop.engine.model.tokenizer import Tokenizer

    try:
        path = default_model_path()
    except ModelFileError as e:
        pytest.skip(str(e))
    tokenizer = Tokenizer.from_gguf(path)
    for dtype in ("float32", "bfloat16"):
        m = load_model(path, dtype=dtype, device="cuda")
        out = greedy(ModelRunner(m, kv_capacity_tokens=512), chat_ids(tokenizer, "What is the capital of France?"))
        assert tokenizer.decode(out).startswith("The capital of France is Paris."), dtype


def _decoding(runner: ModelRunner, prompts: list[list[int]]) -> list[Request]:
    return prefill_to_decoding(runner, [Request(i, ids, SamplingParams(max_tokens=16, ignore_eos=True))
                                        for i, ids in enumerate(prompts)])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-3), ("bfloat16", 0.05)])
def test_synthetic_model_on_cuda_agrees_with_the_cpu(dtype, tol):
    """The same synthetic weights on both devices (4 layers of SmolLM2's shapes), each prefilling its
    own cache: three decode steps' logits on CUDA (paged attention, replayed from a graph on a side
    stream, and eagerly) agree with the CPU's to `tol` of the largest logit; every graph step replayed."""
    from pdtop.engine.runtime.graph_counts import replayed

    prompts = [list(range(100 + 7 * i, 100 + 7 * i + n)) for i, n in enumerate((5, 200, 33))]
    runs = {}
    for device in ("cpu", "cuda"):
        m = synthetic_model("synthetic:smollm2-135m", dtype=dtype, device=device, num_layers=4, seed=5)
        runner = ModelRunner(m, kv_capacity_tokens=2048)
        reqs = _decoding(runner, prompts)
        runs[device] = (m, runner, reqs)
    cpu_m, cpu_r, cpu_reqs = runs["cpu"]
    gpu_m, gpu_r, gpu_reqs = runs["cuda"]
    assert torch.equal(gpu_m.embed_weight.cpu(), cpu_m.embed_weight)
    for a, b in zip(cpu_reqs, gpu_reqs, strict=True):  # decode the CPU's tokens on both
        b.output_ids[-1:] = a.output_ids[-1:]
    dec = gpu_r.cuda
    assert dec is not None and dec.paged, dec.describe()
    stream = torch.cuda.Stream()
    dec.sync_streams({stream.cuda_stream: stream})
    for _ in range(3):
        want = cpu_r.next_logits(cpu_reqs)
        with torch.cuda.stream(stream):
            dec.use_graphs = False
            eager = gpu_r.next_logits(gpu_reqs).float().cpu()
            dec.use_graphs = True
            before = dec.counts.snapshot()
            graph = gpu_r.next_logits(gpu_reqs).float().cpu()
            assert replayed(before, dec.counts.snapshot()), dec.describe()
        scale = float(want.abs().max())
        assert scale > 0
        for name, got in (("eager", eager), ("graph", graph)):
            assert float((got - want).abs().max()) <= tol * scale, (name, dec.attention)
        tokens = want.argmax(-1).tolist()
        for reqs in (cpu_reqs, gpu_reqs):  # the CPU's tokens on both, as `decode` takes them
            for q, t in zip(reqs, tokens, strict=True):
                q.num_cached += 1
                append_token(q, t, 0.0, ())
