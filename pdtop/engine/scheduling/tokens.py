"""What a token means: `append_token`, the one place a token is appended and "finished" decided
(nano-vllm's `Scheduler.postprocess`), and `generate`, one request alone through the same rule
(`pdtop generate`, tests).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from pdtop.engine.request import Request, RequestStatus
from pdtop.engine.runtime.executor import Executor, S


def append_token(req: Request, token: int, now: float, eos_ids: Sequence[int]) -> bool:
    """Append one sampled token at time `now`; True when that finishes the request.

    The one place a request's status moves past prefill and "finished" is decided:
    on an end-of-sequence token (unless `ignore_eos`) or one of its `stop_token_ids` (both "eos",
    as vLLM 0.33 stops on either before it looks at the length), or at `max_tokens`. The sampler
    keeps `min_tokens` by masking those tokens; the simulator samples nothing, so here too none
    of them ends a request before its `min_tokens`.
    """
    req.output_ids.append(token)
    req.token_times.append(now)
    if ((not req.params.ignore_eos and token in eos_ids) or token in req.params.stop_token_ids) \
            and len(req.output_ids) > req.params.min_tokens:
        req.status, req.finish_reason = RequestStatus.FINISHED, "eos"
    elif len(req.output_ids) >= req.params.max_tokens:
        req.status, req.finish_reason = RequestStatus.FINISHED, "length"
    else:
        req.status = RequestStatus.DECODING
    return req.finished


def generate(runner: Executor[S], req: Request) -> Iterator[int]:
    """Run one new request alone: admit, prefill, decode until `append_token` finishes it.

    Yields each token once appended (the first right after the prefill); the request's
    KV is freed at the end, also when the caller stops early.
    """
    runner.admit(req)
    try:
        req.status = RequestStatus.PREFILLING
        tokens = runner.prefill([req])
        while True:
            finished = append_token(req, tokens[0], time.perf_counter(), runner.cfg.eos_ids)
            yield tokens[0]
            if finished:
                return
            tokens = runner.decode([req])
    finally:
        runner.free(req)
