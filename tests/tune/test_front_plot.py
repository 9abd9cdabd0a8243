"""`pdtop tune`'s plot says what it clamps (issue 42 item 14): configurations with an ITL above twice the SLO
are drawn on the top row, whose label reads `≥` and a line under the plot says how many and up to what;
its figures are written as the dashboard writes them (`pdtop.format`)."""
from __future__ import annotations

import re
import subprocess
import sys

from pdtop import format as fmt

SMALL = "decode_bs=8,decode_prompt=512,long_tokens=4096,long_prompts=2"


def test_points_above_the_top_of_the_plot_are_said_to_be():
    done = subprocess.run([sys.executable, "-m", "pdtop", "tune", "--device", "sim:H100", "--slo-itl-ms", "14",
                           "--workload", SMALL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if line == "ITL p99") + 1
    assert lines[top].lstrip().startswith(f"≥ {fmt.ms(0.028)} │"), lines[top]
    said = next(line for line in lines if "drawn on the top row" in line)
    match = re.search(rf"(\d+) of (\d+) configurations above {re.escape(fmt.ms(0.028))} \(up to ([\d.]+) ms\)", said)
    assert match and 0 < int(match.group(1)) <= int(match.group(2)) and float(match.group(3)) > 28, said
    assert "SLO 14.0 ms │" in done.stdout and "- ms" not in done.stdout
