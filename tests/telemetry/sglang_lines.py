"""Log lines in SGLang's exact formats: `configure_logger`'s `[%(asctime)s{prefix}] %(message)s` with the
scheduler's rank prefix (`configure_scheduler_process`: " DP{n}", " PP{n}", " ATTN_CP{n}", " MOE_DP{n}",
" TP{n}", " EP{n}" in that order), and the messages of SGLang 0.5.23's
`python/sglang/srt/multiplex/multiplexing_mixin.py` and `managers/scheduler_components/metrics_reporter.py`
(`log_prefill_stats`, `log_decode_stats`; the usage parts of `pool_stats_observer.py`), with older
releases' forms ("Decode batch. ...", `#unbootstrapped-req`, `#transferring-req`) as their users' logs
show them."""
from __future__ import annotations

H100_LEVELS = [(132, 0), (112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60), (0, 132)]
WHEN = "2026-12-01 10:00:01"
PLAIN = "#token: 4096, token usage: 0.03"  # get_decode_usage_msg_parts, a plain model
HYBRID_SWA = "#full token: 2048, full token usage: 0.41, #swa token: 512, swa token usage: 0.52"
HYBRID_SSM = "#full token: 2048, full token usage: 0.41, mamba num: 12, mamba usage: 0.30"


def line(message: str, rank: str = " TP0", when: str = WHEN) -> str:
    return f"[{when}{rank}] {message}\n"


def start_up(levels=H100_LEVELS, rank: str = " TP0") -> str:
    return line(f"PD-Multiplexing enabled with {len(levels)} stream groups, sm_counts (prefill_sm, decode_sm): "
                f"{list(levels)}", rank)


def adjust(level: int, levels=H100_LEVELS, rank: str = " TP0") -> str:
    p, d = levels[level]
    return line(f"Adjusting stream groups: {level}, prefill sm: {p}, decode sm: {d}", rank)


def decode_message(running: int = 12, queued: int = 3, usage: str = PLAIN, graph: str = "cuda graph",
                   throughput: float = 812.45, pd: str = "") -> str:
    """0.5.23's Decode batch message (`pd`: a PD decode server's part, `decode_pd`)."""
    return (f"Decode batch, #running-req: {running}, {usage}, {pd}{graph}: True, "
            f"gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}")


def decode_batch(running: int = 12, queued: int = 3, rank: str = " TP0", **kw: object) -> str:
    return line(decode_message(running, queued, **kw), rank)  # type: ignore[arg-type]


def decode_pd(prealloc: int, transfer: int, host_receive: int | None = None) -> str:
    """A PD decode server's part of the Decode batch message (host-receive with a threshold below 1)."""
    receive = f"#host-receive-req: {host_receive}, " if host_receive is not None else ""
    return (f"pre-allocated usage: 0.28, #prealloc-req: {prealloc}, #transfer-req: {transfer}, {receive}"
            "#retracted-req: 0, ")


def prefill_batch(new_tokens: int = 9, running: int = 4, queued: int = 0, rank: str = " TP0",
                  usage: str = "token usage: 0.03", graph: str = "cuda graph", throughput: float = 1204.51,
                  bootstrap: int | None = None, inflight: int = 0) -> str:
    """0.5.23's Prefill batch message (`bootstrap`: a PD prefill server's queues)."""
    pd = "" if bootstrap is None else f"#bootstrap-req: {bootstrap}, #inflight-req: {inflight}, #optimistic-req: 0, "
    return line(f"Prefill batch, #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, {usage}, "
                f"#running-req: {running}, #queue-req: {queued}, #pending-token: 0, {pd}{graph}: False, "
                f"input throughput (token/s): {throughput:.2f}", rank)


def old_decode_batch(running: int, queued: int, usage: float, throughput: float, rank: str = " TP0") -> str:
    """SGLang 0.3-0.4's form (as in its 2024 issues): "." after the name, no graph field."""
    return line(f"Decode batch. #running-req: {running}, #token: 234, token usage: {usage:.2f}, "
                f"gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}", rank)


def old_prefill_pd(bootstrap: int, queued: int, transferring: int) -> str:
    """An older PD prefill server's line (2025): `#unbootstrapped-req`, `#transferring-req`, a trailing space."""
    return line(f"Prefill batch. #new-seq: 1, #new-token: 1, #cached-token: 25, token usage: 0.00, #running-req: 0, "
                f"#unbootstrapped-req: {bootstrap}, #queue-req: {queued}, #transferring-req: {transferring} ", "")
