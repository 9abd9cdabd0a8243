"""The default demo on a simulated GPU: a steady decode batch with long prompts prefilling beside it
within seconds, and a virtual clock that can be slowed down to watch it."""
from __future__ import annotations

import threading
import time

from pdtop.engine.build import build_engine
from pdtop.engine.records import RoundRecord
from pdtop.engine.scheduling.workload import demo_workload


def test_sim_demo_multiplexes_within_ten_seconds():
    engine = build_engine("sim:H100", workload=demo_workload("sim"))
    assert engine.describe().workload == demo_workload("sim").describe()
    rounds = []
    while engine.device.now() < 10.0:
        rounds.append(engine.step())
    steady = sorted(r.decode_bs for r in rounds if r.time > 2.0)
    assert 32 <= steady[len(steady) // 20] and steady[-1] <= 64  # 95% of rounds decode 32..64 requests
    beside = [r for r in rounds if r.decode_bs >= 32 and r.prefill_units and r.decode_units
              and any(p.tokens >= 8192 for p in r.prefills)]
    assert beside  # an 8192-token prompt prefilled on its share of SMs while the batch decoded
    layers = {p.layers_done for r in beside for p in r.prefills if p.tokens >= 8192}
    assert len(layers) >= 4  # its progress shows layer by layer, not 0 then done


def test_a_slowed_clock_is_reported_no_sooner_than_wall_time_allows():
    engine = build_engine("sim:H100", workload=demo_workload("sim"))
    speed, clock0 = 0.5, engine.device.now()
    seen: list[tuple[float, float]] = []  # (wall seconds since start, engine seconds since start)
    engine.add_sink(lambda r: seen.append((time.perf_counter() - wall0, r.time - clock0))
                    if isinstance(r, RoundRecord) else None)
    stop = threading.Event()
    wall0 = time.perf_counter()
    thread = threading.Thread(target=engine.run, args=(stop,), kwargs={"speed": speed})
    thread.start()
    time.sleep(1.0)
    stop.set()
    thread.join(10)
    assert len(seen) > 10
    assert all(wall >= clock / speed - 1e-3 for wall, clock in seen[:-1])  # the last one may be cut short by stop
    assert engine.device.now() - clock0 < 2.0  # unpaced, a second of wall time would simulate minutes
