"""The options that compare the ways (`tune --policies`, `--link` of tune, bench and serve): bad input
is one line and exit 2 (the comparison itself: tests/tune/test_policy_comparison.py)."""
from __future__ import annotations

import pytest

from pdtop.cli import main


@pytest.mark.parametrize(("args", "words"), [
    (["tune", "--slo-itl-ms", "20", "--policies", "pdmux,fifo"], "--policies takes"),
    (["tune", "--slo-itl-ms", "20", "--policies", "disagg", "--link", "carrier-pigeon"], "unknown link"),
    (["tune", "--slo-itl-ms", "20", "--link", "rdma100"], "--link applies to disagg"),
    (["bench", "--link", "-3"], "GB/s must be > 0"),
    (["bench", "--link", "none"], "disagg's KV needs a link"),
    (["serve", "--link", "carrier-pigeon"], "unknown link"),
    (["bench", "--device", "cuda:0", "--policy", "disagg"], "--device sim:H100"),
    (["bench", "--slo-itl-ms", "0"], "--slo-itl-ms must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err, err
