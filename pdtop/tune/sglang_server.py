"""What SGLang's server refuses beside `--enable-pdmux`, per SGLang version: said in the header of every
YAML pdtop writes, and checked on a `tune --launch` command before anything is launched.

SGLang 0.5.23 (`srt/arg_groups/validation_hook.py`) asserts, with `--enable-pdmux`: `pp_size == 1`,
`chunked_prefill_size == -1`, `disaggregation_mode == "null"` and `disable_overlap_schedule`; its
defaults leave chunked prefill on (a size chosen for the GPU) and the overlap schedule on, so a
command needs `--chunked-prefill-size -1 --disable-overlap-schedule`. Newer SGLang (main) runs chunked
prefill with pdmux (docs/levels.md); pdtop keeps the release's other rules for it.
"""
from __future__ import annotations

from pdtop.engine.scheduling.pdmux_config import SGLANG_MAIN, SGLANG_MAIN_NAME, SGLANG_RELEASE

NEEDS = "--pp-size 1, --chunked-prefill-size -1, no --disaggregation-mode and --disable-overlap-schedule"


def rules_line(sglang: str) -> str:
    """One line: what SGLang `sglang` refuses beside `--enable-pdmux`."""
    if sglang == SGLANG_MAIN:
        return (f"{SGLANG_MAIN_NAME}: --enable-pdmux needs --pp-size 1, no --disaggregation-mode and "
                f"--disable-overlap-schedule (SGLang {SGLANG_RELEASE}'s rules; main also takes chunked prefill)")
    return (f"SGLang {SGLANG_RELEASE} starts --enable-pdmux only with {NEEDS} (it refuses anything else: "
            "srt/arg_groups/validation_hook.py)")


def _value(words: list[str], *flags: str) -> str | None:
    for i, w in enumerate(words):
        for flag in flags:
            if w == flag and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(flag + "="):
                return w.split("=", 1)[1]
    return None


def check_command(argv: list[str], sglang: str) -> None:
    """ValueError (one line, naming the version) when `argv` starts SGLang with `--enable-pdmux` and a
    setting that SGLang `sglang` refuses beside it; nothing for other commands."""
    if "--enable-pdmux" not in argv:
        return
    who = SGLANG_MAIN_NAME if sglang == SGLANG_MAIN else f"SGLang {SGLANG_RELEASE}"
    problems = []
    pp = _value(argv, "--pp-size", "--pipeline-parallel-size")
    if pp is not None and pp != "1":
        problems.append(f"--pp-size {pp} (pipeline parallelism)")
    chunk = _value(argv, "--chunked-prefill-size")
    if sglang != SGLANG_MAIN and chunk != "-1":
        problems.append("chunked prefill (its default is on: give --chunked-prefill-size -1)" if chunk is None
                        else f"--chunked-prefill-size {chunk}")
    mode = _value(argv, "--disaggregation-mode")
    if mode is not None and mode != "null":
        problems.append(f"--disaggregation-mode {mode}")
    if "--disable-overlap-schedule" not in argv:
        problems.append("the overlap schedule (on by default: give --disable-overlap-schedule)")
    if problems:
        raise ValueError(f"--launch: {who} refuses --enable-pdmux with {', '.join(problems)} "
                         "(srt/arg_groups/validation_hook.py); every launch would fail")
