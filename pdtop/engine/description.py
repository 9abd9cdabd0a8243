"""What the engine says about itself: typed records of its description and configuration.

`Engine.describe()` returns an `EngineDescription` (the `engine` object of the telemetry
`hello`), `Engine.config_record()` an `EngineConfig` (the whole configuration, which
`hello`, `config` and `seek` carry) and `Device.describe()` a `DeviceDescription`.
These classes are the protocol's schema of those objects: telemetry puts them in its events
(`pdtop.telemetry.events`), writes them as JSON (`pdtop.telemetry.encode`) and turns
received objects back into them (`pdtop.typed_json`); docs/protocol.md documents
their fields. Pairs and triples are tuples here and lists on the wire.

A field whose metadata is `FLAT`, `IF_SET` or `ABSENT` goes on the wire differently from the rest
(see `WIRE`); every other field is a key of its object, null when None.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

WIRE = "wire"  # the metadata key saying how a field is written where it is not simply a key of its own
FLAT = {WIRE: "flat"}  # a dict[str, Any] whose keys are written into the object itself, beside its named
# fields; reading, it collects every key of the object the class does not name
IF_SET = {WIRE: "if_set"}  # a key only when not None (absent from the object otherwise)
ABSENT = {WIRE: "absent"}  # a frozenset[str], no key itself: the fields left out of the object (where a source
# lacks them, though null would say something else); reading, the class's fields the object lacks


@dataclass
class EngineConfig:
    """The whole configuration (`Engine.config_record()`), in `hello`, `config` and `seek`."""

    sm_group_num: int
    manual_divisions: list[tuple[int, int, int]]  # [prefill units, decode units, decode_bs_threshold]
    split_forward_token_budget: int
    decode_bs_divisor: int
    chunk_size: int
    policy: str
    pinned_level: int | None
    levels: list[tuple[int, int]]  # (prefill units, decode units); index = level
    workload_rate: float
    workload_paused: bool
    # SGLang's newer knobs, on the wire only when on (absent: 0 / false, as in recordings made before them)
    max_split_forward_layers: int | None = field(default=None, metadata=IF_SET)  # the slice cap while decode runs
    overlap_decode_full_sm: bool | None = field(default=None, metadata=IF_SET)  # decode on the whole device
    level_rule: str | None = None  # "sglang" | "slo" (null in recordings made before it existed)
    slo_itl_ms: float | None = None  # the ITL SLO of level_rule slo
    chunked_prefill_size: int | None = field(default=None, metadata=IF_SET)  # pdmux prefills longer prompts in chunks


@dataclass
class DeviceDescription:
    """`hello.engine.device` (`Device.describe()`): what every device describes, and the facts of its own
    it adds, for people, in `extra` (cpu: `cores`; sim: `cc`, `peak_flops`, `s_sat`; cuda: `gpu`, `sms`,
    `levels_realized`, ...). On the wire those are keys of the device object itself, beside the named
    fields; read back, `extra` holds every key the class does not name."""

    name: str
    kind: str
    unit_name: str
    units: int
    peak_bw: float | None = field(default=None, metadata=IF_SET)  # bytes/s, when the device knows it (sim GPUs)
    extra: dict[str, Any] = field(default_factory=dict, metadata=FLAT)

    def __post_init__(self) -> None:
        named = {f.name for f in fields(self) if f.metadata.get(WIRE) != "flat"}
        clash = named & set(self.extra)
        if clash:  # one key, two values on the wire
            raise ValueError(f"a device's own facts may not be named like its fields: {sorted(clash)}")


@dataclass
class Totals:
    """`hello.engine.totals`: requests counted since the engine started (a dashboard seeds its counters)."""

    arrived: int
    first_token: int
    finished: int  # finished after running (eos or length)
    rejected: int  # finished with finish_reason "rejected": never ran


@dataclass
class Limits:
    """`hello.engine.limits`: the waiting-queue caps, and what they refused since the engine started."""

    max_waiting_requests: int
    max_waiting_tokens: int
    refused: dict[str, int]  # source ("workload", "inject", "api") -> requests refused


@dataclass
class EngineDescription:
    """`hello.engine`: `Engine.describe()`. The engine fills every field; those that may be None are
    the ones a recording or server older than them lacks."""

    model: str
    num_layers: int
    max_context: int
    device: DeviceDescription
    unit_name: str
    units: int
    virtual_clock: bool
    levels: list[tuple[int, int]]
    config: EngineConfig
    policy: str
    # `Executor.describe()`, for people: dtype, KV cache size, how decode runs (kernels, CUDA graphs). A
    # plain dict: what it holds depends on the executor (sim, CPU or CUDA runner) and nothing reads it typed.
    runtime: dict[str, Any] | None = None
    limits: Limits | None = None  # absent in recordings made before it existed
    totals: Totals | None = None  # absent from servers older than the field
    workload: str | None = None  # one line describing the workload scenario
