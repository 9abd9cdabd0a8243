"""Issue 25 item 11: `pdtop bench --device cpu` printed nothing for 12 s and then ran for minutes with no
ETA. Progress is a rich bar with an ETA on a terminal (plain lines otherwise), each stage of each
policy advances it, and `--quick` is a smaller scenario."""
from __future__ import annotations

import io
import json

from rich.console import Console

from pdtop.bench.cli import BenchProgress
from pdtop.bench.policy_bench import QUICK, SCENARIOS, run_bench
from pdtop.cli import main
from pdtop.engine.build import build_engine


def test_every_stage_of_every_policy_advances_the_bar_to_its_end():
    sc = QUICK["sim"]
    out = io.StringIO()
    progress = BenchProgress(["pdmux", "chunked"], 1 + sc.long_prompts,
                             Console(file=out, force_terminal=True, width=120))
    with progress:
        run_bench(lambda p: (progress.starting(p), build_engine("sim:H100", policy=p))[1], ["pdmux", "chunked"], sc,
                  progress)
    task = progress._bar.tasks[0]
    assert task.completed == task.total == 2 * (1 + sc.long_prompts)
    text = out.getvalue()
    assert "ETA" in text and "6/6" in text


def test_without_a_terminal_each_stage_is_one_plain_line(capsys):
    progress = BenchProgress(["pdmux"], 3, Console(file=io.StringIO()))
    with progress:
        progress.starting("pdmux")
        progress("pdmux: decoding: 4 requests running")
    assert capsys.readouterr().err.splitlines() == ["bench pdmux: decoding: 4 requests running"]


def test_quick_is_smaller_and_says_so_in_the_json(capsys):
    assert QUICK["cpu"].long_prompts < SCENARIOS["cpu"].long_prompts
    assert QUICK["cpu"].long_tokens * QUICK["cpu"].decode_bs < SCENARIOS["cpu"].long_tokens * SCENARIOS["cpu"].decode_bs
    assert main(["bench", "--device", "sim:H100", "--policy", "pdmux", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["long_prompts"] == QUICK["sim"].long_prompts
