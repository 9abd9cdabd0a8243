"""The dataset options `bench --url` and `tune --launch` share (vllm bench serve's names): the flags,
what is wrong with them, and the prompts they name (read by `pdtop.analysis.bench_datasets`)."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdtop.analysis.bench_datasets import Sample
    from pdtop.engine.model.tokenizer import Tokenizer


def add_dataset_arguments(g: argparse._ArgumentGroup, num_prompts: int | None = 1000) -> None:
    """The flags; `num_prompts` None: --num-prompts is None unless given (its default is then 1000)."""
    g.add_argument("--num-prompts", type=int, default=num_prompts, help="requests to send (default 1000)")
    g.add_argument("--dataset-name", choices=("random", "sharegpt", "custom"), default="random",
                   help="random: windows of pdtop's text; sharegpt: ShareGPT's JSON; custom: a JSONL of "
                        '{"prompt", "output_len"} (default random)')
    g.add_argument("--dataset-path", metavar="FILE", help="the sharegpt or custom dataset file")
    g.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="max_tokens of every ShareGPT request (default: the token length of its gpt turn)")
    g.add_argument("--custom-output-len", type=int, default=None,
                   help="max_tokens of every custom request (default: its line's output_len, else 256)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="custom: send each prompt as written, not through the tokenizer's chat template")


def dataset_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the dataset options, if anything (one line)."""
    for name in ("num_prompts", "sharegpt_output_len", "custom_output_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    if args.dataset_name == "random" and args.dataset_path:
        return "--dataset-path needs --dataset-name sharegpt or custom (random makes its own prompts)"
    if args.dataset_name != "random" and not args.dataset_path:
        return f"--dataset-name {args.dataset_name} needs --dataset-path FILE"
    return None


def dataset_prompts(args: argparse.Namespace, tokenizer: Tokenizer, num: int, seed: int) -> list[Sample]:
    """The sharegpt or custom dataset's prompts, `(text, max_tokens, prompt tokens)`, in seeded order;
    DatasetError (a ValueError, one line) when the file is not what it should be."""
    from pdtop.analysis.bench_datasets import custom_prompts, sharegpt_prompts

    if args.dataset_name == "sharegpt":
        return list(sharegpt_prompts(args.dataset_path, tokenizer.encode, num, seed, args.sharegpt_output_len))

    def chat(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}])

    if not args.skip_chat_template and tokenizer.chat_template is None:
        raise ValueError(f"{tokenizer.source}: no chat template for the custom prompts; "
                         "pass --skip-chat-template to send them as written")
    return list(custom_prompts(args.dataset_path, tokenizer.encode, num, seed, args.custom_output_len,
                               None if args.skip_chat_template else chat))
