"""The embedded engine: a small facade over sub-packages by job.

- `model/`: the Llama-family model, its GGUF loader, tokenizer and sampling;
- `runtime/`: the model runner, the paged KV cache and the executors that run work;
- `scheduling/`: the scheduler round, split levels, pdmux config, workload and control;
- `roofline/`: the cost model and GPU specs the simulator and the estimate price work with;
- `devices/`: where work runs (CPU cores, CUDA green contexts, a simulated GPU).

Everything outside the engine imports from here or from those sub-packages; the
engine imports neither telemetry nor the UI.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["build_engine", "Engine", "PdmuxConfig", "WorkloadSpec", "EngineError",
           "RoundRecord", "RequestRecord", "ConfigChange", "PrefillProgress"]

if TYPE_CHECKING:
    from pdtop.engine.build import build_engine
    from pdtop.engine.engine import Engine
    from pdtop.engine.errors import EngineError
    from pdtop.engine.records import ConfigChange, PrefillProgress, RequestRecord, RoundRecord
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig
    from pdtop.engine.scheduling.workload import WorkloadSpec

_WHERE = {
    "build_engine": "pdtop.engine.build", "Engine": "pdtop.engine.engine", "EngineError": "pdtop.engine.errors",
    "PdmuxConfig": "pdtop.engine.scheduling.pdmux_config", "WorkloadSpec": "pdtop.engine.scheduling.workload",
    "RoundRecord": "pdtop.engine.records", "RequestRecord": "pdtop.engine.records",
    "ConfigChange": "pdtop.engine.records", "PrefillProgress": "pdtop.engine.records",
}


def __getattr__(name: str) -> Any:
    """Lazy: `import pdtop.engine` stays cheap (no torch) until a name is used."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pdtop.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
