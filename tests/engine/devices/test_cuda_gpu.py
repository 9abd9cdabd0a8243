"""The CUDA path on a GPU (`pytest -m cuda`; skipped elsewhere): realized levels, the Triton kernel and
prefix attention on the GPU, CUDA graphs against eager decode, KV sizing from free memory, NVML matching,
and the engine end to end. A 2-layer model with qwen3-8b's shapes keeps it to seconds."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("cuda") is None,
                       reason="needs an NVIDIA GPU, CUDA torch and cuda-python"),
]


@pytest.fixture(scope="module")
def model():
    from pdtop.engine.model.synthetic import synthetic_model

    return synthetic_model("synthetic:qwen3-8b", dtype="bfloat16", device="cuda", num_layers=2)


def test_levels_realize_as_carved():
    """What the driver realizes, checked only as far as is sound: against the driver's own partition
    limits (the device's for the first carve, the carved context's for the second) when it reports
    them, else each side at least what it asked for and the pair on the device. What was seen is
    recorded (a warning in the test log), whatever the outcome."""
    import warnings

    from pdtop.engine.devices.cuda import CudaDevice
    from pdtop.engine.devices.sm_split import plan_split
    from pdtop.engine.errors import DeviceError

    total = torch.cuda.get_device_properties(0).multi_processor_count
    dev = CudaDevice()
    try:
        auto = list(zip(dev.requested, dev.realized, dev.carves(), strict=True))
        limits, manual = dev.gc.limits, {}
        for p, d in ((60, 40), (60, 4)):
            try:
                manual[(p, d)] = pair = dev.gc.split(p, d)
            except DeviceError as e:
                manual[(p, d)] = str(e)
                continue
            dev.gc.destroy(pair)
        warnings.warn(f"cuda levels seen: limits {limits}; automatic (requested, realized, carve) {auto}; "
                      f"manual {manual}", stacklevel=1)
        for (p, d), (rp, rd), _ in auto[1:-1]:
            assert rp >= p and rd >= d and rp + rd <= total
        for (p, d), made in manual.items():
            real, inner = (None, None) if isinstance(made, str) else (made.realized, made.outer_limits)
            if limits.source == "driver" and (inner is None or inner.source == "driver"):
                assert real == plan_split(p, d, total, limits, inner)  # what the driver's own limits imply
            elif real is not None:
                assert real[0] >= p and real[1] >= d and sum(real) <= total
        got = dev.set_groups([(total, 0), (60, 40), (0, total)])
        assert got[1] == getattr(manual[(60, 40)], "realized", None) and dev.groups == [g for g in got if g is not None]
    finally:
        dev.close()


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None,
                    reason="sm_probe needs cuda.bindings.nvrtc")
def test_levels_run_on_the_sms_they_were_given():
    """Where each level's kernels run (sm_probe), against the driver's count: never on more SMs than a
    side's context holds, within a few of it, the two sides on disjoint SMs, and a compute-bound kernel's
    time in proportion. What was seen is recorded (a warning in the test log)."""
    import warnings

    from pdtop.engine.devices.cuda import CudaDevice

    dev = CudaDevice()
    try:
        measured = dev.measure_sms()
        warnings.warn(f"cuda measured_sms: {list(zip(dev.realized, measured, strict=True))}", stacklevel=1)
        for (p, d), m in zip(dev.realized, measured, strict=True):
            assert m is not None
            for given, side in ((p, m["prefill"]), (d, m["decode"])):
                if not given:
                    assert side is None
                    continue
                assert given - 4 <= side["smid_distinct"] <= given
                assert side["timed_sms"] == pytest.approx(given, rel=0.15)
            assert m["shared_smids"] == (0 if p and d else None)
    finally:
        dev.close()


def test_an_overlapped_level_runs_decode_on_the_whole_device_at_high_priority():
    """SGLang's overlap_decode_full_sm: prefill on its green context, decode on a plain whole-device stream."""
    from pdtop.engine.devices.base import Work
    from pdtop.engine.devices.cuda import OVERLAP_DECODE_PRIORITY, CudaDevice
    from pdtop.engine.devices.sm_split import plan_level

    total = torch.cuda.get_device_properties(0).multi_processor_count
    p = total * 3 // 4
    dev = CudaDevice(groups=[(total, 0), (p, total), (0, total)])
    try:
        assert dev.groups[1] == plan_level(p, total, total, dev.gc.limits) and dev.groups[1][1] == total
        dev.set_level(1)
        prefill, decode = dev.side_streams()
        assert decode.priority == OVERLAP_DECODE_PRIORITY and not isinstance(decode, torch.cuda.ExternalStream)
        assert isinstance(prefill, torch.cuda.ExternalStream)
        x = torch.ones(1 << 20, device="cuda")
        dev.submit_prefill(Work("prefill", 0, 0, lambda: (x * 2).sum()))
        assert float(dev.run_decode(Work("decode", 0, 0, lambda: (x * 3).sum()))) == 3 * (1 << 20)
        assert float(dev.wait_prefill()) == 2 * (1 << 20)
    finally:
        dev.close()


def test_triton_kernel_matches_sdpa_on_the_gpu():
    from pdtop.engine.model.paged_attention import paged_decode, reference

    g = torch.Generator(device="cuda").manual_seed(0)
    page, lens = 16, [1, 15, 16, 17, 600, 1024]
    blocks = len(lens) * 64
    for dtype in (torch.bfloat16, torch.float32):
        k, v = (torch.randn(8, blocks * page + 1, 128, generator=g, device="cuda", dtype=dtype) for _ in range(2))
        table = torch.randperm(blocks, generator=g, device="cuda").view(len(lens), 64).int()
        ctx = torch.tensor(lens, device="cuda", dtype=torch.int32)
        q = torch.randn(len(lens), 48, 128, generator=g, device="cuda", dtype=dtype)[:, :32]  # strided rows
        want = reference(q, k, v, table, ctx, page, 128 ** -0.5)
        for splits in (1, 2, 16):
            got = paged_decode(q, k, v, table, ctx, page, 128 ** -0.5, splits)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
            assert (got.float() - want).abs().max().item() < tol, (dtype, splits)


def test_prefix_attention_takes_a_fused_kernel_not_math():
    from torch.nn.attention import sdpa_kernel

    from pdtop.engine.model.llama import sdpa_gqa
    from pdtop.engine.model.paged_attention import _prefix, fused_backends, prefix_mode

    mode = prefix_mode(torch.device("cuda", 0), torch.bfloat16, 128, 4)
    assert mode in ("gqa", "expand")
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 32, 512, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 2560, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = _prefix("mask", q.float(), k.float(), v.float(), 4, 128 ** -0.5)
    with sdpa_kernel(fused_backends()):  # math disabled: these must still run
        got = _prefix(mode, q, k, v, 4, 128 ** -0.5)
        sdpa_gqa(q, k[:, :, :512], v[:, :, :512], 4, is_causal=True)  # a prefill with no prefix
    assert (got.float() - want).abs().max().item() < 3e-2


def test_graph_decode_equals_eager_on_every_level(model):
    from warm_start import prefill_to_decoding

    from pdtop.engine.devices.cuda import CudaDevice
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner

    dev = CudaDevice()
    runner = ModelRunner(model, 16384)
    try:
        assert runner.cuda is not None and runner.cuda.paged, runner.cuda.describe()
        dev.add_streams_listener(runner.cuda.sync_streams)
        info = runner.cuda.describe()["cuda_graphs"]
        assert info["streams"] == len(dev.groups)  # each split level's, the whole GPU's decode one, run_whole's
        assert not info["failed"] and info["graphs"] == info["streams"] * len(info["buckets"])
        prompts = [list(range(1000 + 7 * i, 1000 + 7 * i + n)) for i, n in enumerate((5, 200, 33))]
        reqs = prefill_to_decoding(runner, [Request(i, ids, SamplingParams(max_tokens=8))
                                            for i, ids in enumerate(prompts)])
        for level in range(len(dev.groups)):
            dev.set_level(level)
            stream = dev.side_streams()[1]
            with torch.cuda.stream(stream):
                runner.cuda.use_graphs = False
                eager = runner.next_logits(reqs).clone()
                runner.cuda.use_graphs = True
                graph = runner.next_logits(reqs).clone()
            stream.synchronize()
            # the graph ran a batch padded to 4 rows: the same math, maybe other GEMM kernels
            assert (graph - eager).abs().max() <= 0.02 * eager.abs().max(), level
    finally:
        dev.close()


def test_kv_cache_sized_from_free_memory(model):
    from pdtop.engine.build import build_engine
    from pdtop.engine.errors import EngineError

    total = torch.cuda.mem_get_info()[1]
    engine = build_engine("cuda", "synthetic:qwen3-8b", loaded_model=model, gpu_memory_fraction=0.3,
                          cuda_graphs=False)
    try:
        kv = engine.describe().runtime["kv_cache"]
        assert kv["tokens"] > 16 and kv["bytes"] < 0.3 * total and "0.3 of" in kv["line"]
    finally:
        engine.close()
    with pytest.raises(EngineError, match=r"^--kv-tokens .* needs .* GiB; only"):
        build_engine("cuda", "synthetic:qwen3-8b", loaded_model=model, kv_capacity_tokens=10**9)


def test_nvml_watches_the_engines_gpu():
    from pdtop.engine.devices.green_ctx import GreenContexts
    from pdtop.telemetry.hardware.nvml_sampler import NvmlSampler

    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("needs nvidia-ml-py")
    gc = GreenContexts(0)
    try:
        s = NvmlSampler(uuid=gc.uuid, pci_bus_id=gc.pci_bus_id)
        assert s.available and s.describe()["matched_by"] in ("uuid", "pci_bus_id"), s.reason
        assert s.name == torch.cuda.get_device_name(0)
        s.close()
    finally:
        gc.close()


@pytest.mark.parametrize("policy", ["pdmux", "chunked", "prefill-first"])
def test_engine_end_to_end(model, policy):
    from pdtop.engine.build import build_engine

    engine = build_engine("cuda", "synthetic:qwen3-8b", policy=policy, loaded_model=model, kv_capacity_tokens=65536)
    try:
        reqs = [engine.submit(list(range(10, 10 + n)), 12, ignore_eos=True) for n in (40, 3000, 700, 9000)]
        engine.run_until_idle(10_000)
        assert all(r.finished and len(r.output_ids) == 12 for r in reqs)
        assert engine.describe().runtime["cuda_graphs"]["graphs"] > 0
    finally:
        engine.close()
