"""What the engine reports: plain dataclasses, one per round, request, KV transfer and config change.

The engine hands these to its sinks (callables registered with `Engine.add_sink`);
telemetry turns them into JSON with `dataclasses.asdict`. Times are seconds on the
engine's clock (wall time for real devices, virtual time for `sim:` devices).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PrefillProgress:
    """One in-flight prefill batch (pdmux; or one prompt chunk by chunk under `chunked_prefill_size`), chunked
    prefill request or disagg prefill batch."""

    request_ids: list[int]
    tokens: int  # prompt tokens in this prefill
    # the share of `tokens` done, in layers: each token through every layer counts `layers_total` (every policy)
    layers_done: int
    layers_total: int
    layers_per_round: int  # k = min(L, max(1, budget // tokens)); 0 for chunked/prefill-first
    # chunked: prompt tokens prefilled so far; a pdmux chunk: those cached before it;
    # None where layers tell the whole progress
    tokens_done: int | None = None


@dataclass
class DisaggState:
    """Under `disagg`, the prefill instance and the link beside the decode instance's round
    (docs/protocol.md): SGLang's queues, pdtop's pools."""

    reserving: int  # requests waiting for the decode instance to reserve their KV slots
    prefill_queue: int  # slots reserved, waiting for the prefill instance
    prefilling: int  # requests in the prefill instance's batch in flight
    prefill_kv_used_tokens: int  # the prefill instance's own pool
    prefill_kv_capacity_tokens: int
    transfers: int  # KV transfers queued or in flight on the link
    transfer_bytes: int  # their bytes
    link: str  # the link's name ("rdma100", "12.5 GB/s", "memory copy")
    prefill_units: int  # SMs (of the second GPU) or cores of the prefill instance
    devices: int  # GPUs or core sets the two instances use: 2


@dataclass
class KvTransfer:
    """One prompt's KV sent from the prefill instance's pool to the decode instance's (`disagg`)."""

    time: float  # engine clock when reported: the transfer's end, as every record's `time`
    request_id: int
    bytes: int
    reserved: float  # when the decode instance reserved the slots (before the prefill started)
    start: float  # engine clock: the copy began (after the prefill and any earlier transfer)
    end: float
    link: str


@dataclass
class RoundRecord:
    """One scheduler round."""

    index: int
    time: float  # engine clock at the end of the round
    policy: str  # "pdmux" | "chunked" | "prefill-first" | "disagg"
    level: int  # index into the split levels
    prefill_units: int  # SMs or cores given to prefill this round
    decode_units: int
    pinned: bool  # level pinned by an operator (else automatic)
    decode_bs: int  # requests in the decode step this round
    decode_step_s: float  # duration of the decode step (0 when none ran)
    round_s: float  # whole round duration
    prefills: list[PrefillProgress]
    tokens_emitted: int  # tokens sampled this round (decode + first tokens)
    waiting: int
    running: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    bytes_moved: float  # estimated bytes read/written this round (weights + KV)
    flops: float  # estimated FLOPs this round
    instance: str | None = None  # "decode" under disagg (the decode instance's round); null: one instance
    disagg: DisaggState | None = None  # under disagg: the prefill instance and the link
    # level_rule slo: per level, the decode step its model predicts beside a prefill (null where it
    # has none, and for every level under SGLang's rule)
    predicted_steps_s: list[float | None] | None = None


@dataclass
class RequestRecord:
    """A request event: kind is "arrival", "first_token" or "finish"."""

    kind: str
    request_id: int
    time: float
    prompt_tokens: int
    output_tokens: int = 0
    ttft_s: float | None = None  # set on first_token and finish
    itls_s: list[float] = field(default_factory=list)  # set on finish: gaps between consecutive tokens
    # on finish: "eos" | "length" | "stop" (a stop string) | "abort" (its client left) | "rejected" (never ran)
    finish_reason: str | None = None
    source: str | None = None  # "workload" | "inject" | "api" (null in recordings made before it existed)


@dataclass
class ConfigChange:
    """An applied control change, at a round boundary (`control.Change.changes`)."""

    time: float
    round_index: int
    changes: dict[str, dict[str, Any]]  # field -> {"old": ..., "new": ...}
    client: str | None = None  # who asked (telemetry fills in the client id)
