"""pdmux's chunked prefill with layer slicing: a long prompt's TTFT and decode's step, per chunked_prefill_size.

`--decode-bs` requests decode while one `--prompt`-token prompt arrives, on a device (default
`sim:H100`, deterministic: the machine's load does not move its figures; `cpu` runs the real
model). Per chunk size (0: off, whole prompt): the chunks, the rounds until the first token, the
TTFT and the slowest decode step while it prefilled.

Usage: .venv/bin/python bench/pdmux_chunks.py [--device sim:H100] [--sizes 0,4096,2048,1024,512]
"""
from __future__ import annotations

import argparse
import math

from pdtop.engine.build import build_engine
from pdtop.engine.scheduling.pdmux_config import PdmuxConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="sim:H100")
    ap.add_argument("--sizes", default="0,4096,2048,1024,512")
    ap.add_argument("--decode-bs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=8192, help="tokens of the long prompt")
    args = ap.parse_args()
    print(f"{args.device}: {args.decode_bs} requests decoding, one {args.prompt}-token prompt")
    print(f"{'chunked_prefill_size':>20} {'chunks':>6} {'rounds':>6} {'TTFT ms':>9} {'max step ms':>11}")
    for size in (int(s) for s in args.sizes.split(",")):
        engine = build_engine(args.device, config=PdmuxConfig(chunked_prefill_size=size))
        try:
            for _ in range(args.decode_bs):
                engine.submit(engine.prompts.make(256), 2000, ignore_eos=True)
            engine.run_until_idle(max_rounds=args.decode_bs + 5)
            req = engine.submit(engine.prompts.make(args.prompt), 2, ignore_eos=True)
            steps: list[float] = []
            while not req.output_ids:
                steps.append(engine.step().decode_step_s)
            chunks = math.ceil(args.prompt / size) if 0 < size < args.prompt else 1
            assert req.ttft is not None
            print(f"{size:>20} {chunks:>6} {len(steps):>6} {req.ttft * 1e3:>9.1f} {max(steps) * 1e3:>11.2f}")
        finally:
            engine.close()


if __name__ == "__main__":
    main()
