"""The decode-only baseline that bench/gpu_check.py compares pdmux's ITL with (issue 30, item 1)."""
from __future__ import annotations

from pdtop.analysis.metrics import summary_ms
from pdtop.bench.policy_bench import decode_only_itls
from pdtop.engine.build import build_engine


def test_decode_only_itls_leave_out_what_ran_before():
    """Requests decode, then the clock jumps 5 s (in gpu_check: the policy run's replayed baselines),
    then decode-only rounds: every ITL is a decode step, none is the 5 s gap before the first of them."""
    engine = build_engine("sim:H100", workload=None)
    try:
        reqs = [engine.submit(engine.prompts.make(256), 64, ignore_eos=True) for _ in range(4)]
        while any(len(r.token_times) < 3 for r in reqs):
            engine.step()
        step = engine.step().decode_step_s  # what one decode-only step of these four costs
        engine.device.idle(5.0)
        itls = decode_only_itls(engine, rounds=10)
    finally:
        engine.close()
    assert len(itls) == 4 * 9  # each request's 9 gaps between its 10 tokens; the gap into them is left out
    s = summary_ms(itls)
    assert 0 < s["max"] < 2 * step * 1e3 < 1000  # the old rule (`b > start`) had a 5,000 ms gap here
