"""Log lines in SGLang's exact formats: `configure_logger`'s `[%(asctime)s{prefix}] %(message)s` with the
scheduler's rank prefix, and the messages of `python/sglang/srt/multiplex/multiplexing_mixin.py`."""
from __future__ import annotations

H100_LEVELS = [(132, 0), (112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60), (0, 132)]


def line(message: str, rank: str = " TP0", when: str = "2026-12-01 10:00:01") -> str:
    return f"[{when}{rank}] {message}\n"


def start_up(levels=H100_LEVELS, rank: str = " TP0") -> str:
    return line(f"PD-Multiplexing enabled with {len(levels)} stream groups, sm_counts (prefill_sm, decode_sm): "
                f"{list(levels)}", rank)


def adjust(level: int, levels=H100_LEVELS, rank: str = " TP0") -> str:
    p, d = levels[level]
    return line(f"Adjusting stream groups: {level}, prefill sm: {p}, decode sm: {d}", rank)


def decode_batch(running: int = 12, queued: int = 3, rank: str = " TP0") -> str:
    return line(f"Decode batch, #running-req: {running}, #token: 4096, token usage: 0.03, cuda graph: True, "
                f"gen throughput (token/s): 812.45, #queue-req: {queued}, ", rank)
