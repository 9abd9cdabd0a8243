"""Estimate, with a roofline model, what one long prefill does to a running decode batch.

Compares decode only, prefill first, chunked prefill and PD multiplexing (at the split
SGLang's rule picks for the decode batch, for several S_SAT values: the SM count at which
decode saturates memory bandwidth). Defaults reproduce the seed's table: Qwen3-8B on an
H100 decoding 32 requests of 2048 tokens when an 8192-token prefill arrives. Decode reads
the weights and KV once per step at 85% of peak bandwidth; prefill runs at 50% MFU.

A last row prices PD disaggregation 1P1D over --link: the prompt prefilled on a second,
whole GPU, then its KV (tokens x 2 x layers x kv_heads x head_dim x 2 bytes) sent to the
decode GPU at the link's bandwidth; decode keeps the decode-only ITL. It costs twice the
GPUs and the transfer on TTFT, and buys no interference at all.

Inputs outside what the model means (an S_SAT above the GPU's SMs, a prompt or context longer
than the model's, KV more than the GPU's memory) are said on stderr, one line each, and the
table is printed all the same.
"""
from __future__ import annotations

import argparse
import json
import sys

from pdtop.commands.common import fail, number_list, positive_int
from pdtop.engine.roofline.gpu_specs import CUSTOM_HELP
from pdtop.engine.roofline.kv import LINK_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--gpu", default="H100",
                        help=f"H100 (SXM), H200, A100, H20, or {CUSTOM_HELP} (default: H100)")
    parser.add_argument("--model", default="qwen3-8b",
                        help="synthetic model shapes: qwen3-8b, llama3.1-8b, smollm2-135m (default: qwen3-8b)")
    parser.add_argument("--decode-bs", default="32", help="requests in decode (default: 32)")
    parser.add_argument("--context", default="2048", help="context tokens of each decode request (default: 2048)")
    parser.add_argument("--prompt", default="8192", help="tokens of the prefill that arrives (default: 8192)")
    parser.add_argument("--chunks", default="2048,512",
                        help="chunk sizes for the chunked-prefill rows (default: 2048,512)")
    parser.add_argument("--s-sat", default="44,66,88",
                        help="SM counts at which decode saturates bandwidth, one pdmux row each (default: 44,66,88)")
    parser.add_argument("--config", metavar="FILE",
                        help="SGLang pdmux YAML (sm_group_num, manual_divisions, decode_bs_divisor, "
                             "overlap_decode_full_sm) for the split choice")
    parser.add_argument("--link", default="rdma400",
                        help=f"the link of the PD disaggregation row: {LINK_HELP}, a number in GB/s "
                             "(10^9 bytes/s), or none for no such row (default: rdma400)")
    parser.add_argument("--json", action="store_true",
                        help='print {"rows": [{"name", "kind", "itl_ms", "prefill_ms", "tokens", "gpus", ...}]} '
                             "with unrounded values; the disagg row adds transfer_ms, kv_mb and link_gb_s")


def run(args: argparse.Namespace) -> int:
    from pdtop.analysis.estimate import estimate, format_table, notes, out_of_range
    from pdtop.engine.errors import EngineError
    from pdtop.engine.model.config import synthetic_config
    from pdtop.engine.roofline.gpu_specs import parse_gpu
    from pdtop.engine.roofline.kv import parse_link
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config

    try:
        decode_bs = positive_int("--decode-bs", args.decode_bs)
        context = positive_int("--context", args.context)
        prompt = positive_int("--prompt", args.prompt)
        chunks = number_list("--chunks", args.chunks, int)
        s_sats = number_list("--s-sat", args.s_sat, float)
        spec = parse_gpu(args.gpu)
        cfg = synthetic_config(args.model)
        config = load_pdmux_config(args.config) if args.config else PdmuxConfig()
        link = parse_link(args.link, "--link")
        rows = estimate(spec, cfg, decode_bs, context, prompt, chunks, s_sats, config, link)
    except (ValueError, EngineError) as exc:  # ValueError: this command's own argument parsing
        return fail("estimate", exc)
    for problem in out_of_range(spec, cfg, decode_bs, context, prompt, s_sats):
        print(f"pdtop estimate: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows]}))
        return 0
    print(f"{spec.name}, {cfg.name}: decoding {decode_bs} requests (context {context}) "
          f"when one {prompt}-token prefill arrives:")
    for line in [*format_table(rows), *notes(rows)]:
        print(line)
    return 0
