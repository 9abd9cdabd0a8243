"""The decode batch's ITL read from consecutive rounds, as the dashboard and `tune --launch` both count it.

Every request in a round's decode batch got a token at the round's end, so its gap is the time since the
batch last got tokens (the previous round that decoded, or that a prefill joined it in), counted once per
request in the batch, at most `MAX_GAPS_PER_ROUND` times (bounded work per round). A missed round breaks
the chain: the gap over it is not counted; so does a round with nothing running.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_GAPS_PER_ROUND = 256


@dataclass
class RoundGaps:
    last_decode: float | None = None  # when the decode batch last got tokens

    def after(self, follows: bool, t: float, decode_bs: int, running: int) -> float | None:
        """The gap this round's decode batch waited (None: it decoded nothing, or the chain is broken);
        `follows`: the round is the one after the previous round seen."""
        if not follows:
            self.last_decode = None
        gap = t - self.last_decode if decode_bs > 0 and self.last_decode is not None else None
        if running == 0:
            self.last_decode = None
        elif decode_bs > 0 or self.last_decode is None:
            self.last_decode = t
        return gap

    @staticmethod
    def repeats(decode_bs: int) -> int:
        """How often one round's gap is counted."""
        return min(decode_bs, MAX_GAPS_PER_ROUND)
