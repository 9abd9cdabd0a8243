"""A change to every rank at once, through SGLang's own `/set_internal_state` (TP > 1, DP attention).

SGLang's tokenizer hands that request to the scheduler of every rank in the same round (its request
broadcast), so each rank's hooked `set_internal_state` applies the change at the same round boundary
and their stream choices never part. The post runs on a thread of its own, one at a time in order:
the telemetry server never waits for SGLang's HTTP server. Rank 0's hook resolves the control
message's future when it applies the change; a post that fails, or a rank that refuses, fails it.
"""
from __future__ import annotations

from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

import httpx

from pdtop.engine.control import Change
from pdtop.engine.errors import ControlError


def _fail(future: Future[Change], reason: str) -> None:
    try:
        future.set_exception(ControlError("cmd", reason))
    except InvalidStateError:  # rank 0 resolved it already
        pass


class InternalStatePoster:
    """Posts `{"server_args": {pdtop_*: n}}` to SGLang's `/set_internal_state` (`knobs.to_internal_state`)."""

    def __init__(self, url: str, key: str | None, timeout: float = 30.0) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pdtop-set-internal-state")

    def __call__(self, args: dict[str, int], future: Future[Change]) -> None:
        self._pool.submit(self._post, args, future)

    def _post(self, args: dict[str, int], future: Future[Change]) -> None:
        try:
            response = httpx.post(self.url, json={"server_args": args}, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            _fail(future, f"could not reach SGLang's /set_internal_state at {self.url}: {exc}")
            return
        if response.status_code != 200:
            _fail(future, f"SGLang's /set_internal_state answered HTTP {response.status_code}: "
                          f"{response.text[:200]!r}")
            return
        try:
            updated = response.json()
        except ValueError:
            updated = None
        if not isinstance(updated, list) or not updated or not all(u is True for u in updated):
            _fail(future, f"SGLang refused the change on a rank (its log says why): {updated!r:.200}")
        elif not future.done():
            _fail(future, "every rank applied the change, but this rank's scheduler did not see it")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
