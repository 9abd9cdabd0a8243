"""The decode batch's ITL from consecutive rounds: the rule the dashboard and `tune --launch` share."""
from __future__ import annotations

from pdtop.telemetry.round_gaps import MAX_GAPS_PER_ROUND, RoundGaps


def test_a_gap_runs_from_the_last_round_that_gave_the_batch_tokens():
    g = RoundGaps()
    assert g.after(True, 1.0, 0, 1) is None  # a prefill's first token: the batch starts here
    assert g.after(True, 1.5, 2, 2) == 0.5
    assert g.after(True, 1.7, 0, 2) is None  # a round that decoded nothing: the chain goes on
    assert g.after(True, 2.0, 2, 2) == 0.5  # from 1.5, not from 1.7


def test_a_missed_round_or_an_empty_batch_breaks_the_chain():
    g = RoundGaps()
    g.after(True, 1.0, 4, 4)
    assert g.after(False, 3.0, 4, 4) is None  # the round before it was not seen: no gap over it
    assert g.after(True, 3.2, 4, 4) is not None
    g.after(True, 3.4, 0, 0)  # nothing running
    assert g.after(True, 9.0, 1, 1) is None


def test_a_round_counts_once_per_request_in_its_batch_up_to_a_bound():
    assert RoundGaps.repeats(32) == 32 and RoundGaps.repeats(10_000) == MAX_GAPS_PER_ROUND
