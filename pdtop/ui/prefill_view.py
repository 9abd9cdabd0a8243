"""In-flight prefills as the prefill panel shows them: progress and an ETA per prefill."""
from __future__ import annotations

import math
from dataclasses import dataclass

from pdtop.engine.records import PrefillProgress

FirstSeen = dict[tuple[int, ...], tuple[float, int]]  # a prefill's requests -> (time, layers done) first seen


@dataclass
class PrefillView:
    """One in-flight prefill as the prefill panel shows it."""

    request_ids: list[int]
    tokens: int
    layers_done: int
    layers_total: int
    layers_per_round: int
    eta_s: float | None
    tokens_done: int | None = None  # chunked: progress in tokens


def prefill_views(progress: list[PrefillProgress], t: float, first_seen: FirstSeen, mean_round: float | None,
                  chunk_size: int | None, pdmux_chunk: int = 0) -> tuple[list[PrefillView], FirstSeen]:
    """The views after a round at `t`, and when each was first seen. The ETA: k layers a round (pdmux;
    with `pdmux_chunk`, `chunked_prefill_size`, the layers left of the chunk in flight and the chunks
    after it, at its k), a chunk of tokens a round (chunked), else the pace since it was first seen.
    `layers_done` of `layers_total` is the share of a prefill's `tokens` done, in layers."""
    seen: FirstSeen = {}
    views: list[PrefillView] = []
    for p in progress:
        key = tuple(p.request_ids)
        done, total, k = p.layers_done, p.layers_total, p.layers_per_round
        first = first_seen.get(key, (t, done))
        seen[key] = first
        remaining = max(0, total - done)
        eta: float | None
        if remaining == 0:
            eta = 0.0
        elif k > 0 and mean_round is not None:
            later = 0  # a pdmux chunk's prompt: the whole chunks after this one
            if p.tokens_done is not None and pdmux_chunk > 0:
                n = min(pdmux_chunk, p.tokens - p.tokens_done)  # the chunk in flight: its own layers left
                remaining = total - min(total, max(0, (done * p.tokens - p.tokens_done * total) // max(1, n)))
                later = math.ceil(max(0, p.tokens - p.tokens_done - pdmux_chunk) / pdmux_chunk)
            eta = (math.ceil(remaining / k) + later * math.ceil(total / k)) * mean_round
        elif p.tokens_done is not None and chunk_size is not None and mean_round is not None:
            eta = math.ceil((p.tokens - p.tokens_done) / max(1, chunk_size)) * mean_round
        elif t > first[0] and done > first[1]:
            eta = remaining / ((done - first[1]) / (t - first[0]))
        else:
            eta = None
        views.append(PrefillView(p.request_ids, p.tokens, done, total, k, eta, p.tokens_done))
    return views, seen
