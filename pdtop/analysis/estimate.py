"""The seed's comparison: a decode batch when one long prefill slips in, under five approaches.

decode only (reference), prefill first (one stalled step), chunked prefill (every step
carries a chunk), PD multiplexing at the level SGLang picks for the decode batch, for
several S_SAT values, and, given a link, PD disaggregation 1P1D: the prompt prefilled on
a second GPU of its own, its KV sent over the link, decode undisturbed on the first.
Times are roofline estimates from `cost` and `kv`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdtop.engine.errors import EngineError
from pdtop.engine.model.config import ModelConfig
from pdtop.engine.roofline.cost import (
    chunk_step_time,
    decode_bytes,
    decode_time,
    prefill_flops,
    prefill_time,
)
from pdtop.engine.roofline.gpu_specs import GpuSpec
from pdtop.engine.roofline.kv import Link, kv_bytes, transfer_time
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
from pdtop.engine.scheduling.splits import SplitTable


@dataclass
class EstimateRow:
    name: str
    kind: str  # "decode-only" | "prefill-first" | "chunked" | "pdmux" | "disagg"
    itl_ms: float  # decode ITL; for prefill-first the one stalled step, for chunked the mean step
    prefill_ms: float | None = None  # for disagg the prefill plus its KV transfer
    tokens: float | None = None  # tokens each decode request produces during the prefill
    steps: int | None = None  # chunked only
    prefill_sms: int | None = None  # pdmux only
    decode_sms: int | None = None
    s_sat: float | None = None
    gpus: int = 1  # disagg: 2 (one prefill GPU, one decode GPU)
    transfer_ms: float | None = None  # disagg only: the prompt's KV over the link
    kv_mb: float | None = None  # disagg only: the prompt's KV, in MB (10^6 bytes)
    link_gb_s: float | None = None  # disagg only

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _fmt(value: float | None, unit: str = "") -> str:
    """Rounded, with its unit; "-" for what a row does not have."""
    return "-" if value is None else f"{value:.0f}{unit}"


def _num(value: float) -> str:
    return f"{value:g}"


def estimate(spec: GpuSpec, cfg: ModelConfig, decode_bs: int = 32, context: int = 2048, prompt: int = 8192,
             chunks: Sequence[int] = (2048, 512), s_sats: Sequence[float] = (44, 66, 88),
             config: PdmuxConfig | None = None, link: Link | None = None) -> list[EstimateRow]:
    """The comparison rows; the pdmux split is the level `SplitTable.choose` picks for `decode_bs`.
    With a `link`, a last row prices PD disaggregation 1P1D over it."""
    for name, value in (("decode batch", decode_bs), ("context", context), ("prompt", prompt)):
        if value < 1:
            raise EngineError(f"{name} must be >= 1, got {value}")
    if any(c < 1 for c in chunks) or any(not s > 0 for s in s_sats):
        raise EngineError("chunk sizes must be >= 1 and S_SAT values > 0")
    config = config or PdmuxConfig()
    base = decode_time(spec, decode_bytes(cfg, [context] * decode_bs), spec.sms)  # S_SAT has no effect on all SMs
    rows = [EstimateRow("decode only (reference)", "decode-only", base * 1e3)]

    t = prefill_time(spec, prefill_flops(cfg, prompt), spec.sms)
    rows.append(EstimateRow("prefill first", "prefill-first", (t + base) * 1e3, t * 1e3, 0.0))

    for chunk in chunks:
        steps = [chunk_step_time(spec, cfg, min(chunk, prompt - k), k, decode_bs, base)
                 for k in range(0, prompt, chunk)]
        rows.append(EstimateRow(f"chunked prefill {chunk}", "chunked", sum(steps) / len(steps) * 1e3,
                                sum(steps) * 1e3, float(len(steps)), len(steps)))

    table = SplitTable.for_gpu(spec.sms, spec.cc_major, config)
    p_sm, d_sm = table.groups[table.choose(decode_bs, True, config)]
    overlap = " (overlapped)" if p_sm + d_sm > spec.sms else ""
    for s_sat in s_sats:
        itl = decode_time(dataclasses.replace(spec, s_sat=s_sat), decode_bytes(cfg, [context] * decode_bs), d_sm)
        # overlapped (decode on the whole device): decode, always running, takes S_SAT SMs, its own first
        taken = max(0, min(spec.sms, math.ceil(s_sat)) - (spec.sms - p_sm)) if overlap else 0
        t = prefill_time(spec, prefill_flops(cfg, prompt), max(1, p_sm - taken))
        rows.append(EstimateRow(f"PD mux {p_sm}/{d_sm}{overlap}, S_SAT={_num(s_sat)}", "pdmux", itl * 1e3, t * 1e3,
                                t / itl, None, p_sm, d_sm, s_sat))
    if link is not None:
        rows.append(disagg_row(spec, cfg, prompt, base, link))
    return rows


def disagg_row(spec: GpuSpec, cfg: ModelConfig, prompt: int, itl: float, link: Link) -> EstimateRow:
    """PD disaggregation 1P1D: the prompt prefilled on a whole GPU of its own, then its KV
    (`prompt x 2 x layers x kv_heads x head_dim x 2` bytes, BF16) sent over `link` to the
    decode GPU, whose ITL stays `itl` (seconds; the decode-only step) all along."""
    kv = kv_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, prompt, dtype_bytes=2)
    xfer = transfer_time(kv, link)
    t = prefill_time(spec, prefill_flops(cfg, prompt), spec.sms) + xfer
    return EstimateRow(f"PD disaggregation 1P1D over {link.name}", "disagg", itl * 1e3, t * 1e3, t / itl,
                       gpus=2, transfer_ms=xfer * 1e3, kv_mb=kv / 1e6, link_gb_s=link.gb_s)


def out_of_range(spec: GpuSpec, cfg: ModelConfig, decode_bs: int, context: int, prompt: int,
                 s_sats: Sequence[float]) -> list[str]:
    """What in these inputs is outside the range the estimate means anything in, one sentence each: an
    S_SAT above the GPU's SMs, a context or prompt past the model's, KV the GPU cannot hold. The rows
    are still priced (the roofline does not care); a person reading them should know."""
    out = [f"S_SAT {_num(s)} is more than the {spec.name}'s {spec.sms} SMs: decode would never saturate its "
           f"bandwidth, while the decode-only row has it do so on all {spec.sms}; S_SAT means something up to "
           f"{spec.sms}" for s in dict.fromkeys(s_sats) if s > spec.sms]
    for what, tokens in (("each decode request's context", context), ("the prompt", prompt)):
        if tokens > cfg.max_context:
            out.append(f"{what} ({tokens:,} tokens) is longer than {cfg.name}'s context ({cfg.max_context:,} tokens)")
    if spec.mem_gib is not None:
        memory = spec.mem_gib * 2**30
        shown = f"the {spec.name}'s memory ({spec.mem_gib:g} GiB, {memory / 1e9:,.1f} GB)"
        prompt_kv = float(kv_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, prompt, dtype_bytes=2))
        resident = decode_bytes(cfg, [context] * decode_bs) + prompt_kv  # the weights and every request's KV
        if prompt_kv > memory:
            out.append(f"the prompt's KV ({prompt_kv / 1e9:,.1f} GB) is more than {shown}: no GPU of these "
                       "could hold it, to prefill, send or receive")
        elif resident > memory:
            out.append(f"the weights, the decode batch's KV and the prompt's KV ({resident / 1e9:,.1f} GB) are more "
                       f"than {shown}: every row assumes they fit on one GPU")
    return out


HEADINGS = ("approach", "decode ITL", "prefill time", "tokens per decode request during the prefill")


def text_cells(row: EstimateRow) -> tuple[str, str, str, str]:
    """The rounded cells of one row, as the text table prints them."""
    itl = _fmt(row.itl_ms, " ms")
    if row.kind == "prefill-first":
        itl = f"one step of {itl}"
    elif row.kind == "chunked":
        itl = f"{itl} x {row.steps} steps"
    prefill = _fmt(row.prefill_ms, " ms")
    if row.kind == "disagg":
        prefill = f"{prefill} incl. {_fmt(row.transfer_ms, ' ms')} KV transfer"
    return row.name, itl, prefill, _fmt(row.tokens)


def format_table(rows: Sequence[EstimateRow]) -> list[str]:
    """Right-aligned columns under HEADINGS."""
    cells = [HEADINGS] + [text_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    return ["  ".join(c[i].rjust(widths[i]) for i in range(4)) for c in cells]


def notes(rows: Sequence[EstimateRow]) -> list[str]:
    """The lines under the table: what PD disaggregation costs and what it buys."""
    out = []
    for r in rows:
        if r.kind != "disagg":
            continue
        out += [f"PD disaggregation costs twice the GPUs ({r.gpus}: one prefills, one decodes; every other row "
                "runs on 1)",
                f"  and the KV transfer on TTFT: the prompt's {r.kv_mb:,.0f} MB of KV at {r.link_gb_s:g} GB/s "
                f"takes {_fmt(r.transfer_ms, ' ms')}.",
                "It buys no interference at all: decode has a GPU of its own, so its ITL is the decode-only ITL."]
    return out
