"""Requests put straight into decoding on a runner, without the scheduler: what tests that check decode
steps need first (admitted, prefilled in one batch, their first token appended). `tests/` is on the
path through its conftest, so a test anywhere imports it as `from warm_start import prefill_to_decoding`."""
from __future__ import annotations

from collections.abc import Sequence

from pdtop.engine.request import Request, RequestStatus
from pdtop.engine.runtime.runner import ModelRunner
from pdtop.engine.scheduling.tokens import append_token


def prefill_to_decoding(runner: ModelRunner, reqs: Sequence[Request]) -> list[Request]:
    """Admit `reqs`, prefill them as one batch and append each one's first token; returns them, decoding."""
    for r in reqs:
        runner.admit(r)
        r.status = RequestStatus.PREFILLING
    for r, token in zip(reqs, runner.prefill(list(reqs)), strict=True):
        append_token(r, token, 0.0, ())
    return list(reqs)
