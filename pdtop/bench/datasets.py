"""Datasets from files, sampled as `vllm bench serve` samples them, and the options that name them
(vllm bench serve's names), which `bench --url` and `tune --launch` share.

The readers follow `vllm/benchmarks/datasets/` (`sharegpt.py`, `custom.py`, `utils.is_valid_sequence`,
`abstractions.maybe_oversample_requests`). Each gives prompts as `(text, max_tokens, prompt_len)`,
the length counted with the local tokenizer (the server's `usage` replaces it when it reports one).

- `sharegpt`: a JSON list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
  "value": ...}, ...]}`. Entries with fewer than two turns are dropped, the rest shuffled with
  Python's `random` seeded by `seed`; turn 0 is the prompt and turn 1's token length the output length
  (unless `output_len` is given); pairs with a prompt or output under 4 tokens, a prompt over 1024 or
  both over 2048 are skipped.
- `custom`: a JSONL of `{"prompt": ..., "output_len": ...}` (vLLM reads only `prompt`; pdtop also takes
  each line's `output_len`, else `output_len`, else vLLM's 256), shuffled the same way; the prompt is
  put through the chat template unless `chat` is None (vLLM's `--skip-chat-template`).

Too few usable samples are topped up by seeded `random.choice`, as vLLM oversamples. A file that is
not what it should be raises DatasetError (a ValueError) with one line naming it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdtop.engine.model.tokenizer import Tokenizer

MAX_DATASET_BYTES = 1 << 30  # read whole, as vLLM does: bounded so a wrong path cannot exhaust memory
CUSTOM_OUTPUT_LEN = 256  # vLLM's --custom-output-len default

Sample = tuple[str, int, int]  # (prompt text, max_tokens, prompt tokens)


class DatasetError(ValueError):
    pass


def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = 4, max_prompt_len: int = 1024,
                      max_total_len: int = 2048, skip_min_output_len_check: bool = False) -> bool:
    """vLLM's pruning of ShareGPT pairs."""
    return not (prompt_len < min_len or (not skip_min_output_len_check and output_len < min_len)
                or prompt_len > max_prompt_len or prompt_len + output_len > max_total_len)


def _read(path: str) -> str:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # /dev/zero says 0 bytes and never ends; a FIFO blocks
            raise DatasetError(f"{path}: not a regular file")
        if st.st_size > MAX_DATASET_BYTES:
            raise DatasetError(f"{path}: {st.st_size} bytes, over the {MAX_DATASET_BYTES} a dataset may have")
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_DATASET_BYTES + 1)  # a file that grows while it is read stays bounded
        if len(text) > MAX_DATASET_BYTES:
            raise DatasetError(f"{path}: over the {MAX_DATASET_BYTES} bytes a dataset may have")
        return text
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not UTF-8 text") from None


def _oversample(samples: list[Sample], num: int, seed: int) -> list[Sample]:
    if len(samples) < num:
        random.seed(seed)
        samples = samples + [random.choice(samples) for _ in range(num - len(samples))]
    return samples


def _turn(entry: Any, i: int) -> str | None:
    """The text of turn `i` of a ShareGPT entry, None when it is not there or not text."""
    turn = entry["conversations"][i]
    return turn["value"] if isinstance(turn, dict) and isinstance(turn.get("value"), str) else None


def sharegpt_prompts(path: str, encode: Callable[[str], list[int]], num: int, seed: int = 0,
                     output_len: int | None = None) -> list[Sample]:
    try:
        data = json.loads(_read(path))
    except ValueError as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: ShareGPT's file is a JSON list of {{\"conversations\": [...]}} objects")
    data = [e for e in data if isinstance(e, dict) and isinstance(e.get("conversations"), list)
            and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    samples: list[Sample] = []
    for entry in data:
        if len(samples) >= num:
            break
        prompt, completion = _turn(entry, 0), _turn(entry, 1)
        if prompt is None or completion is None:
            continue
        prompt_len = len(encode(prompt))
        new_output_len = len(encode(completion)) if output_len is None else output_len
        if is_valid_sequence(prompt_len, new_output_len, skip_min_output_len_check=output_len is not None):
            samples.append((prompt, new_output_len, prompt_len))
    if not samples:
        raise DatasetError(f"{path}: no conversation with a prompt of 4 to 1024 tokens and an answer "
                           "of at least 4 (2048 in all), as vLLM samples ShareGPT")
    return _oversample(samples, num, seed)


def custom_prompts(path: str, encode: Callable[[str], list[int]], num: int, seed: int = 0,
                   output_len: int | None = None, chat: Callable[[str], str] | None = None) -> list[Sample]:
    rows: list[tuple[str, int]] = []
    for n, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise DatasetError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise DatasetError(f"{path}:{n}: each line needs \"prompt\" (text)")
        size = row.get("output_len", CUSTOM_OUTPUT_LEN)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise DatasetError(f"{path}:{n}: \"output_len\" must be an integer >= 1, got {size!r}")
        rows.append((row["prompt"], output_len or size))
    if not rows:
        raise DatasetError(f"{path}: no prompts (one JSON object a line, with \"prompt\")")
    random.seed(seed)
    random.shuffle(rows)
    samples: list[Sample] = []
    for prompt, size in rows[:num]:
        text = chat(prompt) if chat is not None else prompt
        samples.append((text, size, len(encode(text))))
    return _oversample(samples, num, seed)


# ---- the options --------------------------------------------------------------------------------

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


def dataset_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options besides the file that shape the sharegpt or custom dataset's prompts."""
    if args.dataset_name == "sharegpt":
        return {"sharegpt_output_len": args.sharegpt_output_len}
    return {"custom_output_len": args.custom_output_len, "skip_chat_template": args.skip_chat_template}


def dataset_prompts(args: argparse.Namespace, tokenizer: Tokenizer, num: int, seed: int) -> list[Sample]:
    """The sharegpt or custom dataset's prompts, `(text, max_tokens, prompt tokens)`, in seeded order;
    DatasetError (a ValueError, one line) when the file is not what it should be."""
    if args.dataset_name == "sharegpt":
        return list(sharegpt_prompts(args.dataset_path, tokenizer.encode, num, seed, args.sharegpt_output_len))

    def chat(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}])

    if not args.skip_chat_template and tokenizer.chat_template is None:
        raise ValueError(f"{tokenizer.source}: no chat template for the custom prompts; "
                         "pass --skip-chat-template to send them as written")
    return list(custom_prompts(args.dataset_path, tokenizer.encode, num, seed, args.custom_output_len,
                               None if args.skip_chat_template else chat))
