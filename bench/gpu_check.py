#!/usr/bin/env python3
"""GPU check for pdtop's CUDA device: green-context levels, SM scaling, and the seed's comparison.

Run on one NVIDIA GPU (about a minute on an H200; well under 5 minutes):

    python bench/gpu_check.py [--out gpu_check.json]

It needs torch (CUDA build), cuda-python (cuda.bindings), nvidia-ml-py and this repo.
What it measures, written to `$OUT/gpu_check.json` (or `--out`) and summarised on stdout:

1. every split level's green contexts, requested vs realized SMs;
2. per level and side: bf16 matmul TFLOP/s and copy bandwidth on that side's SMs
   (how compute and bandwidth scale with SMs; the copy figure is the S_SAT question);
3. the seed's scenario with a WORKLOAD LABELLED "synthetic-torch": a qwen3-8b-shaped
   decoder (36 layers, bf16, random weights) written here in plain torch ops, not
   pdtop's model runner: decode ITL alone (batch 32, context 2048), with an 8192-token
   prefill under pdmux (decode on the decode green context, prefill layers on the
   prefill one), and under chunked prefill (2048 and 512 tokens per step);
4. NVML samples (idle, and during the pdmux and chunked runs).

`--smoke` runs the workload code on the CPU with tiny shapes and no green contexts,
to check it where no GPU is available.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from pdtop.engine.model.config import SYNTHETIC, ModelConfig

WORKLOAD_LABEL = "synthetic-torch: qwen3-8b shapes in plain torch ops (not pdtop's model runner)"


# -- the workload --------------------------------------------------------------------------
@dataclass
class DecodeState:
    tokens: torch.Tensor  # (B,)
    k: torch.Tensor  # (L, B, kvh, T, hd)
    v: torch.Tensor
    context: int


@dataclass
class PrefillState:
    tokens: torch.Tensor  # (P,)
    k: torch.Tensor  # (L, kvh, P, hd)
    v: torch.Tensor
    x: torch.Tensor | None = None


class SyntheticModel:
    """A decoder with the shapes of `cfg` (GQA attention, QK norm, RoPE, SwiGLU) and random weights."""

    def __init__(self, cfg: ModelConfig, num_layers: int, device: torch.device, dtype: torch.dtype,
                 max_pos: int, seed: int = 0):
        self.cfg, self.L, self.device, self.dtype = cfg, num_layers, device, dtype
        self.nh, self.kvh, self.hd, self.H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden
        self.grp = self.nh // self.kvh
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape: int, std: float = 0.02) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=device, dtype=dtype).mul_(std)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=device, dtype=dtype)

        q_out, kv_out = self.nh * self.hd, self.kvh * self.hd
        self.embed = w(cfg.vocab, self.H)
        self.lm_head = w(self.H, cfg.vocab)
        self.norm = ones(self.H)
        self.layers = [{"ln1": ones(self.H), "wqkv": w(self.H, q_out + 2 * kv_out), "qn": ones(self.hd),
                        "kn": ones(self.hd), "wo": w(q_out, self.H), "ln2": ones(self.H),
                        "wgu": w(self.H, 2 * cfg.ffn), "wd": w(cfg.ffn, self.H)}
                       for _ in range(num_layers)]
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, self.hd, 2, device=device, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)

    @property
    def weight_bytes(self) -> int:
        n = self.embed.numel() + self.lm_head.numel() + sum(t.numel() for d in self.layers for t in d.values())
        return n * self.embed.element_size()

    def decode_state(self, batch: int, context: int) -> DecodeState:
        shape = (self.L, batch, self.kvh, context, self.hd)
        k = torch.randn(shape, device=self.device, dtype=self.dtype)
        tokens = torch.randint(0, self.cfg.vocab, (batch,), device=self.device)
        return DecodeState(tokens, k, torch.randn_like(k), context)

    def prefill_state(self, prompt: int) -> PrefillState:
        shape = (self.L, self.kvh, prompt, self.hd)
        tokens = torch.randint(0, self.cfg.vocab, (prompt,), device=self.device)
        return PrefillState(tokens, torch.empty(shape, device=self.device, dtype=self.dtype),
                            torch.empty(shape, device=self.device, dtype=self.dtype))

    # pieces
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.cfg.rms_eps)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x (N, heads, hd)
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(self, lw: dict, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n, q_out, kv_out = x.shape[0], self.nh * self.hd, self.kvh * self.hd
        qkv = self._rms(x, lw["ln1"]) @ lw["wqkv"]
        q = qkv[:, :q_out].view(n, self.nh, self.hd)
        k = qkv[:, q_out:q_out + kv_out].view(n, self.kvh, self.hd)
        v = qkv[:, q_out + kv_out:].view(n, self.kvh, self.hd)
        if self.cfg.qk_norm:
            q, k = self._rms(q, lw["qn"]), self._rms(k, lw["kn"])
        return self._rope(q, pos), self._rope(k, pos), v

    def _attn_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, nh, hd) against k, v (B, kvh, T, hd): each KV head's query group is a length-grp query."""
        b = q.shape[0]
        o = F.scaled_dot_product_attention(q.view(b, self.kvh, self.grp, self.hd), k, v)
        return o.reshape(b, self.nh * self.hd)

    def _attn_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
        """q (c, nh, hd) for positions start..start+c-1 against k, v (kvh, start+c, hd), causal."""
        c = q.shape[0]
        qq = q.transpose(0, 1).unsqueeze(0)
        kk = k.unsqueeze(0).repeat_interleave(self.grp, dim=1)
        vv = v.unsqueeze(0).repeat_interleave(self.grp, dim=1)
        if start == 0:
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        else:
            cols = torch.arange(start + c, device=q.device)
            mask = cols[None, :] <= (start + torch.arange(c, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
        return o[0].transpose(0, 1).reshape(c, self.nh * self.hd)

    def _mlp(self, lw: dict, x: torch.Tensor) -> torch.Tensor:
        gate, up = (self._rms(x, lw["ln2"]) @ lw["wgu"]).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ lw["wd"]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return (self._rms(x, self.norm) @ self.lm_head).argmax(dim=-1)

    # the three kinds of work
    def decode_step(self, st: DecodeState) -> torch.Tensor:
        """One token for every sequence; the context stays at `st.context` (the last slot is rewritten)."""
        t = st.context - 1
        x = self.embed[st.tokens]
        pos = torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(lw, x, pos)
            st.k[i][:, :, t], st.v[i][:, :, t] = k, v
            x = x + self._attn_decode(q, st.k[i], st.v[i]) @ lw["wo"]
            x = self._mlp(lw, x)
        st.tokens = self._head(x)
        return st.tokens

    def prefill_layers(self, ps: PrefillState, start: int, end: int) -> torch.Tensor | None:
        """Layers [start, end) of the whole prompt; the last call returns the first token (on the device)."""
        if start == 0:
            ps.x = self.embed[ps.tokens]
        x, n = ps.x, ps.tokens.shape[0]
        pos = torch.arange(n, device=x.device)
        for i in range(start, end):
            lw = self.layers[i]
            q, k, v = self._qkv(lw, x, pos)
            ps.k[i].copy_(k.transpose(0, 1))
            ps.v[i].copy_(v.transpose(0, 1))
            x = x + self._attn_prefill(q, ps.k[i], ps.v[i], 0) @ lw["wo"]
            x = self._mlp(lw, x)
        ps.x = x
        return self._head(x[-1:]) if end == self.L else None

    def mixed_step(self, st: DecodeState, ps: PrefillState, start: int, c: int) -> torch.Tensor:
        """Chunked prefill: one decode token per sequence plus prompt tokens [start, start+c) in one pass."""
        b, t = st.tokens.shape[0], st.context - 1
        x = torch.cat((self.embed[st.tokens], self.embed[ps.tokens[start:start + c]]))
        pos = torch.cat((torch.full((b,), t, device=x.device, dtype=torch.long),
                         torch.arange(start, start + c, device=x.device)))
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(lw, x, pos)
            st.k[i][:, :, t], st.v[i][:, :, t] = k[:b], v[:b]
            ps.k[i][:, start:start + c].copy_(k[b:].transpose(0, 1))
            ps.v[i][:, start:start + c].copy_(v[b:].transpose(0, 1))
            od = self._attn_decode(q[:b], st.k[i], st.v[i])
            oc = self._attn_prefill(q[b:], ps.k[i][:, :start + c], ps.v[i][:, :start + c], start)
            x = x + torch.cat((od, oc)) @ lw["wo"]
            x = self._mlp(lw, x)
        st.tokens = self._head(x[:b])
        return st.tokens


# -- devices -------------------------------------------------------------------------------
class PlainDevice:
    """Stand-in when green contexts are unavailable (or --smoke): everything on one stream, no overlap."""

    name, units, groups, level, realized = "plain", 0, [(0, 0)], 0, [(0, 0)]

    def __init__(self, device: torch.device):
        self.device = device
        self._result: Any = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def set_level(self, level: int) -> None:
        self.level = level

    def run_whole(self, work: Any) -> Any:
        out = work.run()
        self._sync()
        return out

    run_decode = run_whole

    def submit_prefill(self, work: Any) -> None:
        self._result = self.run_whole(work)

    def prefill_busy(self) -> bool:
        return False

    def wait_prefill(self) -> Any:
        out, self._result = self._result, None
        return out

    def close(self) -> None:
        pass


def make_work(kind: str, fn: Callable[[], Any]) -> Any:
    from pdtop.engine.devices.base import Work

    return Work(kind, 0.0, 0.0, fn)


# -- measurements --------------------------------------------------------------------------
def stats_ms(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    ys = sorted(x * 1e3 for x in xs)

    def pct(p: float) -> float:
        return round(ys[min(len(ys) - 1, max(0, math.ceil(p / 100 * len(ys)) - 1))], 3)

    return {"n": len(ys), "mean": round(statistics.fmean(ys), 3), "p50": pct(50), "p90": pct(90),
            "p99": pct(99), "max": round(ys[-1], 3)}


class NvmlThread:
    """Samples NVML every `period` seconds on a thread while active."""

    def __init__(self, sampler: Any, period: float = 0.12):
        self.sampler, self.period, self.samples = sampler, period, []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> NvmlThread:
        if self.sampler is not None and self.sampler.available:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(self.period):
            self.samples.append({"t": round(time.perf_counter() - t0, 3), **self.sampler.sample()})

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        out: dict[str, Any] = {"n": len(self.samples)}
        for key in ("dram_bw_util_pct", "sm_util_pct", "sm_occupancy_pct", "mem_busy_pct", "power_w", "sm_clock_mhz"):
            vals = [s[key] for s in self.samples if isinstance(s.get(key), (int, float))]
            out[key] = {"max": max(vals), "mean": round(statistics.fmean(vals), 1)} if vals else "n/a"
        return out


def level_scaling(dev: Any, size: int, reps: int, copy_mib: int) -> list[dict]:
    """Per level and side: bf16 matmul TFLOP/s and device copy GB/s (read + write) on that side's SMs."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(copy_mib * 2**20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def mm() -> None:
        for _ in range(reps):
            torch.mm(a, a)

    def cp() -> None:
        for _ in range(reps):
            dst.copy_(src)

    def timed(side: str, fn: Callable[[], None]) -> float:
        work = make_work("decode" if side == "decode" else "prefill", fn)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            if side == "decode":
                dev.run_decode(work)
            else:
                dev.submit_prefill(work)
                dev.wait_prefill()
            best = min(best, time.perf_counter() - t)
        return best

    rows = []
    for level, (group, real) in enumerate(zip(dev.groups, dev.realized, strict=True)):
        dev.set_level(level)
        row: dict[str, Any] = {"level": level, "requested": list(group), "realized": list(real)}
        for side, sms in (("prefill", real[0]), ("decode", real[1])):
            if sms == 0:
                continue
            t_mm, t_cp = timed(side, mm), timed(side, cp)
            row[side] = {"sms": sms, "tflops": round(2 * size**3 * reps / t_mm / 1e12, 1),
                         "copy_gbps": round(2 * copy_mib * 2**20 * reps / t_cp / 1e9, 1)}
        rows.append(row)
    return rows


def raw_levels() -> list[dict]:
    """When CudaDevice fails: try each level's split directly and record what the driver says."""
    from pdtop.engine.devices.green_ctx import GreenContexts
    from pdtop.engine.scheduling.splits import stream_groups

    gc = GreenContexts(0)
    rows = []
    try:
        for p, d in stream_groups(gc.total_sms, gc.major)[1:-1]:
            try:
                pair = gc.split(p, d)
                rows.append({"requested": [p, d], "realized": list(pair.realized)})
                gc.destroy(pair)
            except Exception as e:
                rows.append({"requested": [p, d], "error": str(e)})
    finally:
        gc.close()
    return rows


def balanced_probe() -> dict:
    """Can this driver give a split level balanced workqueues (CUDA 13.1+)? Not used by the runs below."""
    from pdtop.engine.devices.green_ctx import GreenContexts
    from pdtop.engine.scheduling.splits import choose, stream_groups

    gc = GreenContexts(0)
    try:
        groups = stream_groups(gc.total_sms, gc.major)
        p, d = groups[choose(groups, 32, True)]
        pair = gc.split(p, d, balanced_workqueues=True)
        gc.destroy(pair)
        return {"supported": True, "requested": [p, d], "realized": list(pair.realized)}
    except Exception as e:
        return {"supported": False, "reason": str(e)}
    finally:
        gc.close()


def decode_alone(dev: Any, model: SyntheticModel, st: DecodeState, steps: int, on_decode_side: bool) -> dict:
    work = make_work("decode", lambda: model.decode_step(st).tolist())
    run = dev.run_decode if on_decode_side else dev.run_whole
    run(work)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        run(work)
        times.append(time.perf_counter() - t)
    return {"itl_ms": stats_ms(times)}


def prefill_alone(dev: Any, model: SyntheticModel, ps: PrefillState, on_prefill_side: bool) -> dict:
    work = make_work("prefill", lambda: model.prefill_layers(ps, 0, model.L))
    t = time.perf_counter()
    if on_prefill_side:
        dev.submit_prefill(work)
        dev.wait_prefill()
    else:
        dev.run_whole(work)
    return {"prefill_ms": round((time.perf_counter() - t) * 1e3, 2)}


def pdmux_run(dev: Any, model: SyntheticModel, st: DecodeState, ps: PrefillState, level: int,
              layers_per_round: int) -> dict:
    """The scheduler's pdmux round: keep one layer slice in flight on the prefill side, decode each round."""
    dev.set_level(level)
    decode = make_work("decode", lambda: model.decode_step(st).tolist())
    dev.run_decode(decode)  # warm this level's decode stream
    gaps, nxt, slices = [], 0, 0
    t0 = last = time.perf_counter()
    done_at = None
    while done_at is None:
        if nxt < model.L and not dev.prefill_busy():
            dev.wait_prefill()
            s, e = nxt, min(model.L, nxt + layers_per_round)
            dev.submit_prefill(make_work("prefill", lambda s=s, e=e: model.prefill_layers(ps, s, e)))
            nxt, slices = e, slices + 1
        dev.run_decode(decode)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        if nxt >= model.L and not dev.prefill_busy():
            dev.wait_prefill()
            done_at = now
    return {"level": level, "split": list(dev.groups[level]), "realized": list(dev.realized[level]),
            "layers_per_round": layers_per_round, "slices": slices, "decode_steps_during_prefill": len(gaps),
            "itl_ms": stats_ms(gaps), "prefill_ms": round((done_at - t0) * 1e3, 2)}


def chunked_run(dev: Any, model: SyntheticModel, st: DecodeState, ps: PrefillState, prompt: int, chunk: int) -> dict:
    dev.run_whole(make_work("decode", lambda: model.decode_step(st).tolist()))
    gaps = []
    t0 = time.perf_counter()
    for start in range(0, prompt, chunk):
        c = min(chunk, prompt - start)
        t = time.perf_counter()
        dev.run_whole(make_work("mixed", lambda s=start, c=c: model.mixed_step(st, ps, s, c).tolist()))
        gaps.append(time.perf_counter() - t)
    return {"chunk": chunk, "steps": len(gaps), "itl_ms": stats_ms(gaps),
            "prefill_ms": round((time.perf_counter() - t0) * 1e3, 2)}


# -- driver --------------------------------------------------------------------------------
class Report:
    def __init__(self, path: Path):
        self.path, self.data = path, {"pdtop_gpu_check": 1, "errors": {}}

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            out = fn()
            if out is not None:
                self.data[name] = out
            return out
        except Exception as e:
            self.data["errors"][name] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=6))
            print(f"[gpu_check] {name} FAILED: {type(e).__name__}: {e}", flush=True)
            return None
        finally:
            self.data.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 2)
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, cc=f"{p.major}.{p.minor}",
                   memory_gib=round(p.total_memory / 2**30, 1))
    from pdtop.engine.devices import green_ctx

    env["cuda_bindings"] = green_ctx.bindings_version()
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    ap.add_argument("--out", type=Path, default=default_out, help=f"JSON report (default {default_out})")
    ap.add_argument("--model", default="qwen3-8b", help="synthetic shape name from pdtop.engine.model.config")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers for a quick run")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--chunks", default="2048,512")
    ap.add_argument("--steps", type=int, default=30, help="decode steps for the alone measurements")
    ap.add_argument("--budget", type=int, default=65536, help="split_forward_token_budget")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, no green contexts")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pdtop.engine.scheduling.splits import choose, prefill_layers_per_step

    rep = Report(args.out)
    t_start = time.perf_counter()
    cfg = SYNTHETIC["smollm2-135m" if args.smoke else args.model]
    rep.data["workload"] = WORKLOAD_LABEL.replace("qwen3-8b", cfg.name.removeprefix("synthetic:"))
    rep.section("environment", environment)
    if args.smoke:
        args.layers, args.batch, args.context, args.prompt, args.steps = 2, 4, 64, 256, 3
        args.chunks, args.budget = "128,64", 512
    layers = args.layers or cfg.num_layers
    chunks = [int(c) for c in args.chunks.split(",") if c]

    sampler = None
    if not args.smoke:
        from pdtop.telemetry.hardware.nvml_sampler import NvmlSampler

        sampler = NvmlSampler(0)
        rep.data["nvml"] = {"describe": sampler.describe(), "idle": sampler.sample()}
        if not torch.cuda.is_available():
            rep.data["errors"]["cuda"] = "torch sees no CUDA GPU"
            rep.save()
            print("[gpu_check] no CUDA GPU: nothing to check (use --smoke for a CPU run)")
            return 1

    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    dev: Any = None
    if not args.smoke:
        def levels() -> dict:
            from pdtop.engine.devices.cuda import CudaDevice

            nonlocal dev
            t = time.perf_counter()
            dev = CudaDevice(index=0)
            return {"create_s": round(time.perf_counter() - t, 3), "describe": dev.describe(),
                    "groups": [list(g) for g in dev.groups], "realized": [list(r) for r in dev.realized],
                    "all_match": all(tuple(r) == tuple(g) for g, r in zip(dev.groups, dev.realized, strict=True))}

        rep.section("levels", levels)
        if dev is None:
            rep.section("levels_raw", raw_levels)
        else:
            rep.section("level_scaling", lambda: level_scaling(dev, 8192, 10, 1024))
            rep.section("balanced_workqueues_probe", balanced_probe)
    green = dev is not None
    if dev is None:
        dev = PlainDevice(device)
        rep.data["note"] = "no green contexts: every measurement ran on one stream (no overlap)"

    model = st = ps = None

    def build() -> dict:
        nonlocal model, st, ps
        t = time.perf_counter()
        max_pos = max(args.context, args.prompt) + 1
        model = SyntheticModel(cfg, layers, device, dtype, max_pos)
        st = model.decode_state(args.batch, args.context)
        ps = model.prefill_state(args.prompt)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return {"model": cfg.name, "layers": layers, "dtype": str(dtype),
                "weights_gib": round(model.weight_bytes / 2**30, 2),
                "kv_decode_gib": round(2 * st.k.numel() * st.k.element_size() / 2**30, 2),
                "batch": args.batch, "context": args.context, "prompt": args.prompt,
                "build_s": round(time.perf_counter() - t, 2)}

    rep.section("workload_shape", build)
    if model is None:
        return 2

    n = len(dev.groups)
    level = choose(dev.groups, args.batch, True) if green else 0
    k = prefill_layers_per_step(args.prompt, layers, args.budget)
    dev.set_level(n - 1 if green else 0)
    rep.section("decode_alone_whole", lambda: decode_alone(dev, model, st, args.steps, on_decode_side=False))
    rep.section("prefill_alone_whole", lambda: prefill_alone(dev, model, ps, on_prefill_side=False))
    if green:
        dev.set_level(level)
        rep.section("decode_alone_decode_ctx", lambda: {"split": list(dev.groups[level]),
                                                        **decode_alone(dev, model, st, args.steps, True)})
        rep.section("prefill_alone_prefill_ctx", lambda: {"split": list(dev.groups[level]),
                                                          **prefill_alone(dev, model, ps, True)})

    def with_nvml(fn: Callable[[], dict]) -> Callable[[], dict]:
        def run() -> dict:
            with NvmlThread(sampler) as th:
                out = fn()
            return {**out, "nvml": th.summary()}
        return run

    rep.section("pdmux", with_nvml(lambda: pdmux_run(dev, model, st, ps, level, k)))
    for c in chunks:
        rep.section(f"chunked_{c}", with_nvml(lambda c=c: chunked_run(dev, model, st, ps, args.prompt, c)))
    if sampler is not None:
        rep.data["nvml"]["end"] = sampler.sample()
    rep.data["total_s"] = round(time.perf_counter() - t_start, 1)
    dev.close()
    if sampler is not None:
        sampler.close()
    rep.save()
    print_summary(rep.data)
    print(f"[gpu_check] report: {args.out}")
    return 0 if not rep.data["errors"] else 3


def print_summary(d: dict) -> None:
    env = d.get("environment", {})
    print(f"\n== pdtop gpu_check: {env.get('gpu', 'cpu')} ({env.get('sms', '?')} SMs, cc {env.get('cc', '?')}), "
          f"torch {env.get('torch')}, cuda-bindings {env.get('cuda_bindings')}")
    lv = d.get("levels")
    if lv:
        print(f"levels requested {lv['groups']}\n       realized  {lv['realized']}  (all match: {lv['all_match']})")
    for row in d.get("level_scaling", []):
        sides = "  ".join(f"{s} {row[s]['sms']:>3} SMs {row[s]['tflops']:>6} TFLOP/s {row[s]['copy_gbps']:>7} GB/s"
                          for s in ("prefill", "decode") if s in row)
        print(f"  level {row['level']}: {sides}")
    print(f"workload: {d.get('workload')}")
    print(f"{'scenario':<28}{'ITL p50 ms':>12}{'ITL p99 ms':>12}{'prefill ms':>12}{'steps':>8}")
    for name in ["decode_alone_whole", "decode_alone_decode_ctx", "prefill_alone_whole", "prefill_alone_prefill_ctx",
                 "pdmux"] + [k for k in d if k.startswith("chunked_")]:
        r = d.get(name)
        if not isinstance(r, dict):
            continue
        itl = r.get("itl_ms", {})
        steps = r.get("decode_steps_during_prefill", r.get("steps", itl.get("n", "")))
        label = name + (f" {r['split']}" if "split" in r else "")
        print(f"{label:<28}{itl.get('p50', '-'):>12}{itl.get('p99', '-'):>12}{r.get('prefill_ms', '-'):>12}{steps:>8}")
    for name, err in d.get("errors", {}).items():
        print(f"ERROR {name}: {err.splitlines()[0]}")
    print(f"total {d.get('total_s')} s")


if __name__ == "__main__":
    sys.exit(main())
