"""What the dashboard knows of the engine it shows: the facts of `hello`, and what to show before it."""
from __future__ import annotations

from dataclasses import dataclass

from pdtop.engine.description import EngineDescription
from pdtop.visible import visible


@dataclass
class EngineInfo:
    """What `hello` says about the engine, with what to show before it came."""

    model: str = "?"
    device: str = "?"
    device_kind: str = "?"
    unit_name: str = "units"
    units: int = 0
    peak_bytes_per_s: float | None = None
    workload: str | None = None  # one line describing the workload scenario, when the server says
    weights: str = ""  # what the matmuls run on: "float32", "gguf Q4_1+Q8_0 (avx2)"; "" for simulated models
    server: str = ""  # another engine pdtop runs inside ("SGLang 0.5.23": its plugin); "" for pdtop's own

    @classmethod
    def from_engine(cls, e: EngineDescription) -> EngineInfo:
        """The words of a server's (or a recording's) description, control characters made visible."""
        weights, server = ((e.runtime or {}).get(key) for key in ("weights", "server"))
        return cls(model=visible(e.model, 300), device=visible(e.device.name, 100), device_kind=e.device.kind,
                   unit_name=visible(e.unit_name, 20), units=e.units, peak_bytes_per_s=e.device.peak_bw,
                   workload=visible(e.workload, 300) if e.workload is not None else None,
                   weights=visible(weights, 100) if isinstance(weights, str) else "",
                   server=visible(server, 100) if isinstance(server, str) else "")
