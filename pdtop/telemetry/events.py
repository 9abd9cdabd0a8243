"""The protocol's events as typed classes (docs/protocol.md is the reference).

Every event on the wire is a flat JSON object with `type` and `v`. The engine's records
(`pdtop.engine.records`) are the `round`, `request` and `transfer` payloads, and a `ConfigChange` plus
the whole configuration is a `config` event; the engine's description and configuration
(`hello.engine`) are its records too (`pdtop.engine.description`).
Telemetry adds the rest here. Producers build these classes and `pdtop.telemetry.encode` writes
any of them; consumers turn a received object into one with `pdtop.telemetry.decode.decode_event`,
once, and read typed attributes from then on. The field order is the order on the wire; `IF_SET`
and `ABSENT` fields keep keys out of an object where the protocol has always left them out.
A test keeps the field tables of docs/protocol.md equal to these classes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdtop import __version__
from pdtop.engine.description import ABSENT, IF_SET, EngineConfig, EngineDescription, Totals
from pdtop.engine.records import ConfigChange, KvTransfer, RequestRecord, RoundRecord

PROTOCOL_VERSION = 1
WIRE_MAX_SIZE = 1024 * 1024  # larger frames close the connection, either way (websockets code 1009)


@dataclass
class ScrapeTarget:
    """`hello.scrape`: the Prometheus `/metrics` page pdtop polls (`pdtop attach http://...`)."""

    url: str  # the page, without credentials
    engine: str  # "vllm" | "sglang" | "pdtop": the prefix of its metric names
    model_name: str | None  # the model shown (its `model_name` label); null when the metrics carry none
    models: list[str]  # every `model_name` on the page
    interval_s: float  # seconds between scrapes
    window_s: float  # seconds the rates and percentiles of `metrics` events cover


@dataclass
class FleetTarget:
    """`hello.fleet`: several `/metrics` pages watched together (`pdtop attach URL URL ...`)."""

    interval_s: float  # seconds between reads of each page
    window_s: float  # seconds the rates and percentiles cover
    router: str | None  # the SGLang Model Gateway whose worker listing gave the servers


@dataclass
class ServerRecording:
    """`hello.recording`: whether the server records its events, and where (a key only from servers that say)."""

    path: str | None  # the file it records to; null: not recording


@dataclass
class Hello:
    """The first event on every connection, and the header of a recording. A pdtop server describes its
    engine; a scraped `/metrics` page has no engine description, and `scrape` says what is scraped."""

    pdtop: str = field(default=__version__, kw_only=True)  # the version that wrote it
    client_id: str
    readonly: bool
    engine: EngineDescription | None
    api: str | None = None  # the OpenAI-compatible API's base URL (http://HOST:PORT/v1), when the server runs one
    scrape: ScrapeTarget | None = field(default=None, metadata=IF_SET)
    fleet: FleetTarget | None = field(default=None, metadata=IF_SET)
    # what the server records as this connection starts; absent from servers before it, and for the
    # recorder's own header (the file is the recording)
    recording: ServerRecording | None = field(default=None, metadata=IF_SET)


@dataclass
class ConfigEvent(ConfigChange):
    """An accepted control change with the whole configuration after it."""

    config: EngineConfig = field(kw_only=True)

    @classmethod
    def after(cls, change: ConfigChange, config: EngineConfig) -> ConfigEvent:
        """The event of `change`; `config` is the whole configuration after it (`Engine.config_record()`)."""
        return cls(change.time, change.round_index, change.changes, change.client, config=config)


@dataclass
class Hw:
    """A hardware sample. The GPU fields are absent without a GPU sampler, "n/a" where NVML, the driver or
    the device lacks them (`gpu_reason` says why)."""

    time: float  # Unix seconds
    cpu_percent: list[float]
    host_mem_used_bytes: int
    host_mem_total_bytes: int
    host_mem_percent: float
    gpu_util_pct: float | str | None = field(default=None, metadata=IF_SET)
    mem_busy_pct: float | str | None = field(default=None, metadata=IF_SET)
    dram_bw_util_pct: float | str | None = field(default=None, metadata=IF_SET)
    sm_util_pct: float | str | None = field(default=None, metadata=IF_SET)
    sm_occupancy_pct: float | str | None = field(default=None, metadata=IF_SET)
    sm_clock_mhz: float | str | None = field(default=None, metadata=IF_SET)
    mem_clock_mhz: float | str | None = field(default=None, metadata=IF_SET)
    power_w: float | str | None = field(default=None, metadata=IF_SET)
    mem_used_mib: float | str | None = field(default=None, metadata=IF_SET)
    mem_total_mib: float | str | None = field(default=None, metadata=IF_SET)
    gpu_name: str | None = field(default=None, metadata=IF_SET)
    gpu_reason: str | None = field(default=None, metadata=IF_SET)  # "" when NVML reads the GPU


@dataclass
class Dropped:
    count: int  # events this client did not get, just before this point


@dataclass
class ReplyError:
    field: str | None
    reason: str


@dataclass
class Reply:
    """The answer to one control message."""

    id: str | int | float | None
    ok: bool
    error: ReplyError | None = field(default=None, metadata=IF_SET)  # when ok is false
    path: str | None = field(default=None, metadata=IF_SET)  # RecordStart / RecordStop: the recording file
    readonly: bool | None = field(default=None, metadata=IF_SET)  # auth: whether the connection stays read-only
    # an engine command applied: what it changed, field -> {"old": ..., "new": ...}
    change: dict[str, dict[str, Any]] | None = field(default=None, metadata=IF_SET)


@dataclass
class ErrorNotice:
    """Something the server reports unprompted (a wrong token, a recording that failed)."""

    field: str | None
    reason: str


@dataclass
class Batch:
    """Stream events sent together (`?batch=1`). They stay undecoded: each is decoded on its
    own, so one event of an unknown type does not cost the others."""

    events: list[dict[str, Any]]


@dataclass
class Seek:
    """Replay only: playback moved to `position` (recording seconds); `config` is in force there
    (null in a recording of a scraped `/metrics` page, which has no configuration). `totals` and
    `dropped` are the request counts and the events lost as the replayed window before `position`
    starts, so counts go on from there as when the recording played through."""

    position: float
    config: EngineConfig | None
    totals: Totals | None = field(default=None, metadata=IF_SET)
    dropped: int | None = field(default=None, metadata=IF_SET)


@dataclass
class Quantiles:
    """A latency histogram over the window, as Prometheus's `histogram_quantile` reads the increase of its
    buckets. The percentiles are null when nothing was observed in the window, and, with `note` saying
    why, when the histogram cannot be read (no `+Inf` bucket and no `_count`: an excerpt, a broken
    exporter)."""

    count: float | str | None  # observations in the window; null when the page does not tell
    p50_s: float | str | None
    p90_s: float | str | None
    p99_s: float | str | None
    first_bound_s: float | None = None  # the lowest bucket's bound: a percentile at or below it is "< it"
    note: str | None = field(default=None, metadata=IF_SET)  # why there are no percentiles


@dataclass
class ScrapedSplit:
    """`metrics.split`: an SGLang pdmux server's split, from its log (`--sglang-log`) or inferred from its
    pdmux YAML (`--pdmux-config`) and the scraped batch; /metrics has none."""

    source: str  # "log" | "config"
    inferred: bool  # the level is what SGLang's rule would pick for the scraped batch, not read from the log
    levels: list[tuple[int, int]]  # (prefill SMs, decode SMs); index = level; empty until known
    level: int | None  # the level in force; null when neither the log nor the config tells
    prefill_units: int | None  # SMs of the level in force
    decode_units: int | None
    level_time_s: list[float]  # seconds at each level since the server started (log only; else empty)
    starts: int  # start-up lines read (more than one: the server restarted)
    note: str | None = None  # why the log cannot be read now


@dataclass
class Disagg:
    """`metrics.disagg`: prefill/decode disaggregation figures (SGLang's PD metrics, vLLM's NIXL ones);
    each None where the page lacks it (left out of the object: `absent`) or has it with nothing observed
    yet (null). Latency, speed and size are p50 over the window (a histogram) or the latest value (older
    SGLang's gauges); failures count the window's increase."""

    prefill_bootstrap_queue: float | str | None = None  # requests (prefill server)
    prefill_inflight_queue: float | str | None = None
    decode_prealloc_queue: float | str | None = None  # requests (decode server)
    decode_transfer_queue: float | str | None = None
    decode_host_receive_queue: float | str | None = None  # newer SGLang: KV received to host memory first
    kv_transfer_latency_ms: float | str | None = None
    kv_transfer_speed_gb_s: float | str | None = None
    kv_transfer_mb: float | str | None = None  # per transfer
    kv_bootstrap_ms: float | str | None = None  # newer SGLang: a transfer's bootstrap, p50
    kv_alloc_ms: float | str | None = None  # newer SGLang: waiting for decode KV slots, p50
    bootstrap_failures: float | str | None = None
    transfer_failures: float | str | None = None
    prefill_retries: float | str | None = None
    transfer_metrics: str | None = None  # "gauge", "histogram", "nixl", "mooncake": which kind the transfer figures are
    absent: frozenset[str] = field(default=frozenset(), repr=False, metadata=ABSENT)  # the page has none of these


@dataclass
class LogFigures:
    """`metrics.log`: the figures of a read that SGLang's scheduler log gave (`--sglang-log`), where the
    page lacks them or there is no page (SGLang without `--enable-metrics`)."""

    fields: list[str]  # the `metrics` and `metrics.disagg` fields read from the log
    age_s: float  # seconds since the latest Decode/Prefill batch line was read
    ranks: int  # DP ranks whose lines were summed


@dataclass
class Metrics:
    """One scrape of a Prometheus `/metrics` page, as the panels show it. A figure the server does not
    expose is None, named in `not_exposed` and left out of the object (`absent`); a rate is also None on
    the first scrape (nothing to compare yet), but written as null. A figure whose value was not finite
    is the string "NaN", "+Inf" or "-Inf"."""

    time: float  # Unix seconds
    window_s: float  # seconds the rates and percentiles cover (0 on the first scrape)
    running: float | str | None = None
    waiting: float | str | None = None
    kv_usage: float | str | None = None  # 0 to 1
    prompt_tokens_per_s: float | str | None = None
    generation_tokens_per_s: float | str | None = None
    ttft: Quantiles | None = None
    itl: Quantiles | None = None
    itl_read_p50_s: float | str | None = None  # ITL p50 of the gaps since the previous read alone
    e2e: Quantiles | None = None
    split_level: float | str | None = None  # pdtop's own /metrics only
    prefill_units: float | str | None = None
    decode_units: float | str | None = None
    not_exposed: list[str] = field(kw_only=True)  # names of the fields above that the page lacks
    role: str | None = None  # SGLang's `engine_type` label: "unified", "prefill" or "decode"
    disagg: Disagg | None = None
    split: ScrapedSplit | None = field(default=None, metadata=IF_SET)  # SGLang with --sglang-log / --pdmux-config
    log: LogFigures | None = field(default=None, metadata=IF_SET)  # SGLang with --sglang-log: batch figures
    # the histogram `itl` was read from when it is not the engine's ITL (older SGLang's and vLLM's TPOT)
    itl_metric: str | None = field(default=None, metadata=IF_SET)
    # the figures left out of the object: those not exposed, and the ITL's p50 of the last read with the ITL
    absent: frozenset[str] = field(default=frozenset(), repr=False, metadata=ABSENT)


@dataclass
class FleetServer:
    """One server of a fleet: where it is, its role, whether it answers, and its latest read."""

    url: str  # its /metrics page, without credentials
    address: str  # host:port
    role: str  # "unified" | "prefill" | "decode"
    role_from: str  # "engine_type" (SGLang's label), "option" (--prefill/--decode), "router", "default"
    state: str  # "connecting" | "live" | "stale" (it stopped answering; its last read is kept)
    reason: str | None  # why it is not live, in one line
    engine: str | None  # "vllm" | "sglang" | "pdtop" once read
    model_name: str | None
    reads: int  # good reads so far
    last_read: float | None  # Unix time of the latest good read
    metrics: Metrics | None  # the latest good read
    dp_ranks: list[int] | None = field(default=None, metadata=IF_SET)  # a gateway's DP-aware worker: its ranks
    via: str | None = field(default=None, metadata=IF_SET)  # the page its figures come from, when not its own


@dataclass
class Fleet:
    """Every server of a fleet, once per read interval (`hello.fleet` came first)."""

    time: float  # Unix seconds
    servers: list[FleetServer]


Event = (Hello | RoundRecord | RequestRecord | ConfigEvent | Hw | Dropped | Reply | ErrorNotice | Batch | Seek | Metrics
         | KvTransfer | Fleet)

EVENT_CLASSES: dict[str, type] = {
    "hello": Hello, "round": RoundRecord, "request": RequestRecord, "config": ConfigEvent, "hw": Hw,
    "dropped": Dropped, "reply": Reply, "error": ErrorNotice, "batch": Batch, "seek": Seek, "metrics": Metrics,
    "transfer": KvTransfer,
    "fleet": Fleet,
}
EVENT_TYPES: dict[type, str] = {cls: kind for kind, cls in EVENT_CLASSES.items()}  # the `type` of each class
