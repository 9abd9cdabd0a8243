"""bench/gpu_check.py's verdict (`bench/gpu_targets.py`) on hand-built reports: every target is
always there, met, not met, or not measured (issue 30, item 4), and none passes by accident: dropped
levels, a run with no split level, shared SMs and replayed logits that differ from eager fail (issue 43)."""
from __future__ import annotations

import copy
import json

import pytest
from gpu_targets import TARGETS, measured_count, targets, verdict_word


def _figure(replayed: bool | None = True, host_over_gpu: float = 0.04) -> dict:
    row = {"wall_ms": {"p50": 7.0, "p99": 7.5, "n": 200}, "host_over_gpu": host_over_gpu}
    if replayed is not None:
        row["graph_replayed"] = replayed
    return row


def report_all_met() -> dict:
    """A 132-SM report as gpu_check writes it, with v30driver's `measured_sms` and v30graphs'
    `graph_replayed`, where every target is met."""
    pairs = [(132, 0), (80, 52), (64, 68), (0, 132)]
    levels = [{"level": i, "requested": list(p), "realized": list(p), "graph_vs_eager": {"ok": True}}
              for i, p in enumerate(pairs)]
    for x in levels[1:3]:  # the split levels: %smid's count first, the timed estimate beside it
        p, d = x["realized"]
        x["measured_sms"] = {"prefill": p, "decode": {"smid_distinct": d - 1, "timed_sms": d - 12.0},
                             "shared_smids": 0}
    return {
        "mode": "gpu", "levels": levels,
        "device": {"sms": 132, "levels_requested": [list(p) for p in pairs], "dropped_levels": []},
        "policies": {"pdmux": {"levels": [list(p) for p in pairs]}},
        "decode_step": {"graph": {"alone_whole_gpu": _figure(), "alone_decode_side": _figure(),
                                  "under_prefill": _figure(), "level": {"index": 1, "realized": [80, 52]}}},
        "overlap": [{"level": 1, "realized": [80, 52], "graph_replayed": True},
                    {"level": 2, "realized": [64, 68], "graph_replayed": True}],
        "itl_ms": {"decode_only": 8.0, "pdmux_under_prefill": 10.0, "chunked_2048": 60.0, "chunked_512": 30.0},
    }


def test_every_target_met():
    verdict, notes = targets(report_all_met())
    assert list(verdict) == list(TARGETS) and list(notes) == list(TARGETS)
    assert verdict == dict.fromkeys(TARGETS, True), notes


@pytest.mark.parametrize(("target", "spoil"), [
    ("realized_equals_requested", lambda r: r["levels"][1].update(realized=[88, 44],
                                                                  measured_sms={"prefill": 88, "decode": 44,
                                                                                "shared_smids": 0})),
    ("measured_sms_match_realized", lambda r: r["levels"][2]["measured_sms"].update(decode=132)),
    ("graphs_replayed_on_every_level", lambda r: r["overlap"][1].update(graph_replayed=False)),
    ("graphs_replayed_on_every_level", lambda r: r["decode_step"]["graph"]["alone_whole_gpu"].update(
        graph_replayed=False)),  # the last level's only figure
    ("graph_host_under_10pct_of_gpu", lambda r: r["decode_step"]["graph"]["alone_whole_gpu"].update(
        host_over_gpu=0.5)),
    ("pdmux_itl_p99_within_1.3x_decode_only", lambda r: r["itl_ms"].update(pdmux_under_prefill=10.5,
                                                                          decode_only=8.0)),
    ("pdmux_itl_p99_at_most_quarter_of_chunked_2048", lambda r: r["itl_ms"].update(chunked_2048=39.0)),
])
def test_one_target_not_met(target, spoil):
    report = report_all_met()
    spoil(report)
    verdict, notes = targets(report)
    assert verdict == {**dict.fromkeys(TARGETS, True), target: False}, notes


def test_missing_sections_are_not_measured_never_left_out():
    """A report cut short (only the environment), then one per missing piece: null, never absent."""
    verdict, notes = targets({"mode": "gpu", "environment": {}})
    assert verdict == dict.fromkeys(TARGETS) and all(notes.values())
    cases = {
        "measured_sms_match_realized": lambda r: r["levels"][1].pop("measured_sms"),
        "graphs_replayed_on_every_level": lambda r: r["overlap"][0].pop("graph_replayed"),
        "graph_host_under_10pct_of_gpu": lambda r: (r["decode_step"].pop("graph"),
                                                    r["levels"][-1].pop("graph_vs_eager")),
        "pdmux_itl_p99_within_1.3x_decode_only": lambda r: r["itl_ms"].update(decode_only=None),
        "pdmux_itl_p99_at_most_quarter_of_chunked_2048": lambda r: r["itl_ms"].pop("chunked_2048"),
    }
    for target, spoil in cases.items():
        report = report_all_met()
        spoil(report)
        got, _ = targets(report)
        want = {**dict.fromkeys(TARGETS, True), target: None}
        if target == "graph_host_under_10pct_of_gpu":  # the whole-GPU figure held the last level's only
                # replay flag (beside its one-step comparison, also taken away here)
            want["graphs_replayed_on_every_level"] = None
        assert got == want, target


def test_not_met_outweighs_not_measured():
    """One level eager and another without a flag: not met (a part failed), not "not measured"."""
    report = report_all_met()
    report["overlap"][0]["graph_replayed"] = False
    report["overlap"][1].pop("graph_replayed")
    report["levels"][1]["measured_sms"] = None  # unmeasured sides beside a side that is off
    report["levels"][2]["measured_sms"]["prefill"] = 30
    verdict, notes = targets(report)
    assert verdict["graphs_replayed_on_every_level"] is False and "eager on levels [1]" in notes[
        "graphs_replayed_on_every_level"]
    assert verdict["measured_sms_match_realized"] is False and "level 2 prefill 30 of 64" in notes[
        "measured_sms_match_realized"]


def test_a_report_read_back_from_json_gives_the_same_verdict():
    """gpu_check's JSON turns NaN into null and tuples into lists: the verdict reads either."""
    report = report_all_met()
    report["itl_ms"]["chunked_2048"] = float("nan")
    back = json.loads(json.dumps(copy.deepcopy(report)).replace("NaN", "null"))
    assert targets(report)[0] == targets(back)[0]
    assert targets(back)[0]["pdmux_itl_p99_at_most_quarter_of_chunked_2048"] is None


def test_verdict_words():
    assert [verdict_word(v) for v in (True, False, None)] == ["met", "NOT met", "not measured"]


def test_a_side_measured_by_timing_only_is_compared_by_it():
    """The %smid count wins where there is one (the all-met report's timed figure is 12 SMs off);
    without it, the timed estimate is the measure; neither (or an error string) is not measured."""
    assert measured_count({"smid_distinct": 52, "timed_sms": 40.0}) == 52
    assert measured_count({"smid_distinct": None, "timed_sms": 49.5}) == 49.5
    assert measured_count(52) == 52 and measured_count(None) is None and measured_count("failed") is None
    assert measured_count(True) is None  # a flag is not a count
    report = report_all_met()
    report["levels"][1]["measured_sms"]["decode"] = {"timed_sms": 40.0}
    assert targets(report)[0]["measured_sms_match_realized"] is False
    report["levels"][1]["measured_sms"]["decode"] = {"timed_sms": 50.0}
    assert targets(report)[0]["measured_sms_match_realized"] is True


def test_a_level_without_its_counts_is_not_measured():
    report = report_all_met()
    del report["levels"][2]["realized"]
    verdict, notes = targets(report)
    assert verdict["realized_equals_requested"] is None and "without" in notes["realized_equals_requested"]
    assert verdict["measured_sms_match_realized"] is None


def test_an_overlap_row_may_hold_its_flag_in_a_figure():
    """Where the decode part of an overlap row carries `graph_replayed`, that flag is read."""
    report = report_all_met()
    for row, flag in zip(report["overlap"], (True, False), strict=True):
        del row["graph_replayed"]
        row["together"] = {"wall_ms": {"p50": 9.0}, "graph_replayed": flag}
    verdict, notes = targets(report)
    assert verdict["graphs_replayed_on_every_level"] is False and notes["graphs_replayed_on_every_level"] == (
        "eager on levels [2]")


def _only_whole_device(report: dict) -> dict:
    """What a GPU run whose driver refused every split level records: the table as requested, each split
    level dropped with the driver's reason, and the two whole-device levels that ran."""
    table = report["device"]["levels_requested"]
    report["device"]["dropped_levels"] = [{"level": i, "requested": g, "reason": "cuGreenCtxCreate failed: X"}
                                          for i, g in enumerate(table) if 0 not in g]
    report["levels"] = [{"level": 0, "requested": table[0], "realized": table[0], "measured_sms": None,
                         "graph_vs_eager": {"ok": True}},
                        {"level": 1, "requested": table[-1], "realized": table[-1], "measured_sms": None,
                         "graph_vs_eager": {"ok": True}}]
    report["decode_step"]["graph"]["level"] = {"index": 1, "realized": table[-1]}
    report["overlap"] = []
    report["policies"]["pdmux"]["levels"] = [table[0], table[-1]]
    return report


def test_a_report_holding_only_the_whole_device_levels_does_not_pass():
    """Issue 43 item 1: the levels the driver refused are not "as requested", a GPU run with no split level
    measured nothing isolated, and pdmux's ITL there is not pdmux on split SMs."""
    verdict, notes = targets(_only_whole_device(report_all_met()))
    assert verdict["realized_equals_requested"] is False
    assert notes["realized_equals_requested"].startswith("dropped: level 1 [80, 52] (cuGreenCtxCreate failed")
    assert verdict["measured_sms_match_realized"] is False and "no split level ran" in notes[
        "measured_sms_match_realized"]
    assert verdict["pdmux_itl_p99_within_1.3x_decode_only"] is None
    assert verdict["pdmux_itl_p99_at_most_quarter_of_chunked_2048"] is None
    assert "no split level" in notes["pdmux_itl_p99_at_most_quarter_of_chunked_2048"]
    assert sum(v is True for v in verdict.values()) == 2  # the whole-GPU graph figures, which stand as they are


def test_one_dropped_level_fails_realized_even_when_the_rest_match():
    report = report_all_met()
    report["device"]["levels_requested"].insert(2, [60, 4])
    report["device"]["dropped_levels"] = [{"level": 2, "requested": [60, 4], "reason": "cannot carve it"}]
    verdict, notes = targets(report)
    assert verdict == {**dict.fromkeys(TARGETS, True), "realized_equals_requested": False}, notes
    assert "level 2 [60, 4] (cannot carve it)" in notes["realized_equals_requested"]


def test_levels_without_the_requested_table_are_not_as_requested():
    """A report that lost the table (or a level) cannot say every level ran as requested."""
    report = report_all_met()
    del report["device"]["levels_requested"]
    assert targets(report)[0]["realized_equals_requested"] is None
    report = report_all_met()
    report["device"]["levels_requested"].insert(1, [96, 36])  # asked for, not run, not reported dropped
    verdict, notes = targets(report)
    assert verdict["realized_equals_requested"] is False and "not the table requested" in notes[
        "realized_equals_requested"]


def test_sides_on_shared_sms_fail_the_sm_target():
    """Issue 43 item 2: the right counts on overlapping SMs are not a split."""
    report = report_all_met()
    report["levels"][2]["measured_sms"]["shared_smids"] = 8
    verdict, notes = targets(report)
    assert verdict == {**dict.fromkeys(TARGETS, True), "measured_sms_match_realized": False}, notes
    assert notes["measured_sms_match_realized"] == "level 2's sides share 8 SMs"
    report["levels"][2]["measured_sms"]["shared_smids"] = None  # not measured (one side's probe failed)
    assert targets(report)[0]["measured_sms_match_realized"] is None


def test_an_overlapped_level_may_share_its_sms():
    """SGLang's overlapped level runs decode on the whole device by design: its shared SMs are no fault."""
    report = report_all_met()
    report["levels"][2].update(requested=[64, 132], realized=[64, 132],
                               measured_sms={"prefill": 64, "decode": 132, "shared_smids": 64})
    report["device"]["levels_requested"][2] = [64, 132]
    report["policies"]["pdmux"]["levels"][2] = [64, 132]
    verdict, notes = targets(report)
    assert verdict["measured_sms_match_realized"] is True, notes


def test_replayed_logits_that_differ_from_eager_fail_the_graph_target():
    """Issue 43 item 3: `graph_replayed` counts replays; the one-step comparison says they compute the
    same logits. A level the comparison did not reach is not measured."""
    report = report_all_met()
    report["levels"][2]["graph_vs_eager"] = {"ok": False, "replayed": True, "max_abs_diff": 9.0}
    verdict, notes = targets(report)
    assert verdict == {**dict.fromkeys(TARGETS, True), "graphs_replayed_on_every_level": False}, notes
    assert notes["graphs_replayed_on_every_level"] == (
        "replayed logits differ from eager (or did not replay) on levels [2]")
    report["levels"][2]["graph_vs_eager"] = {"ok": None}
    assert targets(report)[0]["graphs_replayed_on_every_level"] is None
