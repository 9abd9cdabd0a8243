"""Datasets from files, sampled as `vllm bench serve` samples them, and the options that name them
(vllm bench serve's names), which `bench --url` and `tune --launch` share.

The readers follow vLLM 0.33.0's `vllm/benchmarks/datasets/datasets.py` (`ShareGPTDataset`,
`CustomDataset`, `is_valid_sequence`, `maybe_oversample_requests`). Each gives prompts as
`(text, max_tokens, prompt_len)`, the length counted with the local tokenizer (the server's `usage`
replaces it when it reports one).

- `sharegpt`: a JSON list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
  "value": ...}, ...]}`. Entries with fewer than two turns are dropped, the rest shuffled with
  Python's `random` seeded by `seed`; turn 0 is the prompt and turn 1's token length the output length
  (unless `output_len` is given); pairs with a prompt or output under 4 tokens, a prompt over 1024 or
  both over 2048 are skipped.
- `custom`: a JSONL of `{"prompt": ..., "output_tokens": ...}`, shuffled the same way; the prompt is put
  through the chat template unless `chat` is None (vLLM's `--skip-chat-template`). max_tokens is
  `output_len` when given; -1 reads each line's `output_tokens` (vLLM 0.33); without it, pdtop takes
  each line's `output_len`, else vLLM's default 256.

Too few usable samples are topped up by seeded `random.choice`, as vLLM oversamples. A file that is
not what it should be raises DatasetError (a ValueError) with one line naming it.

What a file may cost is bounded by what is parsed, not by its size alone: vLLM `json.load`s the
whole file, where 100 MB of `{}` is 2.65 GB of Python objects. Here a ShareGPT list is read one
entry at a time (`json_list_items`) and a JSONL one line at a time, each at most `MAX_ENTRY_CHARS`
(what parsing one costs: about 40 bytes a character at worst, 160 MB), and only what sampling needs
is kept (an entry's first two turns, a line's prompt and length), at most `MAX_KEPT_BYTES` of it and
`MAX_ENTRIES` entries (the time a file of tiny entries takes: about a second a million). The file
itself is at most `MAX_DATASET_BYTES`. Nesting deeper than the JSON parser goes is one line too.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdtop.engine.model.tokenizer import Tokenizer

MAX_DATASET_BYTES = 1 << 30  # the file (a bound on the time a read takes)
MAX_ENTRY_CHARS = 4 << 20  # one ShareGPT entry or JSONL line, so parsing one costs at most ~160 MB
MAX_KEPT_BYTES = 1 << 30  # what the samples read from a file may hold in memory
MAX_ENTRIES = 4_000_000  # entries or lines in a file (ShareGPT V3 has 94,145)
READ_CHARS = 1 << 20  # a ShareGPT file is read this much at a time
CUSTOM_OUTPUT_LEN = 256  # vLLM's --custom-output-len default
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_SLOT = 8  # a list's pointer to what it holds

Sample = tuple[str, int, int]  # (prompt text, max_tokens, prompt tokens)


class DatasetError(ValueError):
    pass


def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = 4, max_prompt_len: int = 1024,
                      max_total_len: int = 2048, skip_min_output_len_check: bool = False) -> bool:
    """vLLM's pruning of ShareGPT pairs."""
    return not (prompt_len < min_len or (not skip_min_output_len_check and output_len < min_len)
                or prompt_len > max_prompt_len or prompt_len + output_len > max_total_len)


def _open(path: str) -> IO[str]:
    """The file as UTF-8 text, once it is known to be a regular file of at most MAX_DATASET_BYTES."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # /dev/zero says 0 bytes and never ends; a FIFO blocks
            raise DatasetError(f"{path}: not a regular file")
        if st.st_size > MAX_DATASET_BYTES:
            raise DatasetError(f"{path}: {st.st_size} bytes, over the {MAX_DATASET_BYTES} a dataset may have")
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None


class _Kept:
    """What a reader keeps of a file, counted against MAX_KEPT_BYTES and MAX_ENTRIES."""

    def __init__(self, path: str) -> None:
        self.path, self.bytes, self.entries = path, 0, 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise DatasetError(f"{self.path}: over {MAX_ENTRIES} entries, more than a dataset may have")

    def add(self, *objects: object) -> None:
        self.bytes += _SLOT + sum(sys.getsizeof(o) for o in objects)
        if self.bytes > MAX_KEPT_BYTES:
            raise DatasetError(f"{self.path}: its prompts take over {MAX_KEPT_BYTES} bytes in memory, "
                               "more than a dataset may")


def json_list_items(f: IO[str], path: str) -> Iterator[Any]:
    """Each item of the JSON list `f` holds, parsed one at a time (`json.JSONDecoder.raw_decode` over a
    buffer of READ_CHARS reads): an item costs what it costs, the list adds nothing. DatasetError for
    what is not a list, an item over MAX_ENTRY_CHARS, and nesting deeper than the parser goes."""
    decoder = json.JSONDecoder()
    buf, pos, eof, index = "", 0, False, 0

    def fill() -> bool:
        nonlocal buf, pos, eof
        chunk = f.read(READ_CHARS)
        if not chunk:
            eof = True
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    def next_char() -> str:
        """The next character that is not whitespace ("" at the end), not taken."""
        nonlocal pos
        while True:
            pos = _SPACE.match(buf, pos).end()  # type: ignore[union-attr]  # `*` always matches
            if pos < len(buf) or not fill():
                return buf[pos:pos + 1]

    if next_char() != "[":
        raise DatasetError(f"{path}: ShareGPT's file is a JSON list of {{\"conversations\": [...]}} objects")
    pos += 1
    if next_char() == "]":
        pos += 1
    else:
        while True:
            while True:  # parse one item; read on while it runs past the buffer
                item, end = None, -1
                try:
                    item, end = decoder.raw_decode(buf, pos)
                    if end < len(buf) or eof:  # a number at the buffer's end may go on
                        break
                except json.JSONDecodeError as exc:  # at the buffer's end it may just be cut short
                    cut = exc.pos >= len(buf) - 8 or exc.msg.startswith("Unterminated string")
                    if eof or not cut:
                        raise DatasetError(f"{path}: entry {index} is not JSON ({exc.msg})") from None
                except RecursionError:
                    raise DatasetError(f"{path}: entry {index} is nested deeper than the JSON parser goes "
                                       "(a ShareGPT entry is 3 levels deep)") from None
                if len(buf) - pos > MAX_ENTRY_CHARS:
                    break
                fill()
            if (end if end >= 0 else len(buf)) - pos > MAX_ENTRY_CHARS:
                raise DatasetError(f"{path}: entry {index} is over {MAX_ENTRY_CHARS} characters, "
                                   "more than one entry may have")
            yield item
            del item
            pos, index = end, index + 1
            c = next_char()
            if c == "]":
                pos += 1
                break
            if c != ",":
                raise DatasetError(f"{path}: not JSON (after entry {index - 1}: expected ',' or ']')")
            pos += 1
            next_char()
    if next_char():
        raise DatasetError(f"{path}: not JSON (more after the list)")


@contextmanager
def _reading(path: str) -> Iterator[None]:
    """A read's UnicodeDecodeError and OSError as DatasetError."""
    try:
        yield
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None


def _oversample(samples: list[Sample], num: int, seed: int) -> list[Sample]:
    if len(samples) < num:
        random.seed(seed)
        samples = samples + [random.choice(samples) for _ in range(num - len(samples))]
    return samples


def _turn(turns: list[Any], i: int) -> str | None:
    """The text of turn `i` of a ShareGPT entry, None when it is not there or not text."""
    turn = turns[i]
    return turn["value"] if isinstance(turn, dict) and isinstance(turn.get("value"), str) else None


def sharegpt_pairs(path: str) -> list[tuple[str, str] | None]:
    """Each entry with at least two turns, as vLLM filters them, in the file's order: its first two
    turns' texts, or None where they are not both text (an entry vLLM would fail on)."""
    kept = _Kept(path)
    out: list[tuple[str, str] | None] = []
    with _open(path) as f, _reading(path):
        for entry in json_list_items(f, path):
            kept.entry()
            turns = entry.get("conversations") if isinstance(entry, dict) else None
            if not isinstance(turns, list) or len(turns) < 2:
                continue
            prompt, completion = _turn(turns, 0), _turn(turns, 1)
            if prompt is None or completion is None:
                out.append(None)
                kept.add()
                continue
            out.append((prompt, completion))
            kept.add(out[-1], prompt, completion)
    return out


def sharegpt_prompts(path: str, encode: Callable[[str], list[int]], num: int, seed: int = 0,
                     output_len: int | None = None) -> list[Sample]:
    data = sharegpt_pairs(path)
    random.seed(seed)
    random.shuffle(data)  # the permutation depends only on the length: vLLM's order of the same entries
    samples: list[Sample] = []
    for pair in data:
        if len(samples) >= num:
            break
        if pair is None:
            continue
        prompt, completion = pair
        prompt_len = len(encode(prompt))
        new_output_len = len(encode(completion)) if output_len is None else output_len
        if is_valid_sequence(prompt_len, new_output_len, skip_min_output_len_check=output_len is not None):
            samples.append((prompt, new_output_len, prompt_len))
    if not samples:
        raise DatasetError(f"{path}: no conversation with a prompt of 4 to 1024 tokens and an answer "
                           "of at least 4 (2048 in all), as vLLM samples ShareGPT")
    return _oversample(samples, num, seed)


def _custom_rows(path: str, output_len: int | None) -> list[tuple[str, int]]:
    """(prompt, max_tokens) of each line, read one line at a time."""
    kept = _Kept(path)
    rows: list[tuple[str, int]] = []
    with _open(path) as f, _reading(path):
        n = 0
        while line := f.readline(MAX_ENTRY_CHARS + 1):
            n += 1
            if len(line) > MAX_ENTRY_CHARS:
                raise DatasetError(f"{path}:{n}: over {MAX_ENTRY_CHARS} characters, more than a line may have")
            if not line.strip():
                continue
            kept.entry()
            try:
                row = json.loads(line)
            except ValueError:
                raise DatasetError(f"{path}:{n}: not a JSON object") from None
            except RecursionError:
                raise DatasetError(f"{path}:{n}: nested deeper than the JSON parser goes") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise DatasetError(f"{path}:{n}: each line needs \"prompt\" (text)")
            if output_len == -1:  # vLLM 0.33: each line's output_tokens
                if "output_tokens" not in row:
                    raise DatasetError(f"{path}:{n}: no \"output_tokens\" (--custom-output-len -1 reads each "
                                       "line's, as vLLM 0.33)")
                name, size = "output_tokens", row["output_tokens"]
            else:
                name, size = "output_len", row.get("output_len", CUSTOM_OUTPUT_LEN)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                got = repr(size) if isinstance(size, int | float) else type(size).__name__
                raise DatasetError(f"{path}:{n}: \"{name}\" must be an integer >= 1, got {got}")
            rows.append((row["prompt"], output_len if output_len and output_len > 0 else size))
            kept.add(rows[-1], row["prompt"])
    return rows


def custom_prompts(path: str, encode: Callable[[str], list[int]], num: int, seed: int = 0,
                   output_len: int | None = None, chat: Callable[[str], str] | None = None) -> list[Sample]:
    rows = _custom_rows(path, output_len)
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
                   help="max_tokens of every custom request; -1: each line's output_tokens, as vLLM 0.33 "
                        "(default: its line's output_len, else 256)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="custom: send each prompt as written, not through the tokenizer's chat template")


def dataset_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the dataset options, if anything (one line)."""
    for name in ("num_prompts", "sharegpt_output_len", "custom_output_len"):
        value = getattr(args, name)
        if value is not None and value < 1 and not (name == "custom_output_len" and value == -1):
            also = " (or -1)" if name == "custom_output_len" else ""
            return f"--{name.replace('_', '-')} must be >= 1{also}, got {value}"
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
