"""Run the engine with its workload and serve telemetry and control over a websocket.

The default workload shows PD multiplexing within seconds: a steady decode batch (a closed
loop: each request that finishes is replaced) while a long prompt arrives every few seconds
(skipped while the previous one still waits for its first token), seeded:
{scenarios}
--rate adds Poisson arrivals on top.

The engine runs rounds on its own thread (a sim: device is paced to wall time x --speed); every
round, request and config change is streamed to each connected client as JSON (see
docs/protocol.md), with a hardware sample about once a second. Clients send control
messages (pin a level, change knobs, inject a long prompt) on the same connection.

The first line on stdout is `pdtop serve: listening on ws://HOST:PORT` (with --port 0
the port is picked for you). Binding anything but a loopback address needs --token;
with a token set, clients without it (`ws://HOST:PORT/?token=...` or a first message
an `auth` message with the token) may watch but not control. Browser pages are refused
unless their origin is allowed (--allow-origin), and clients may record only to new
files inside --record-dir. Ctrl-C stops cleanly; if the engine stops on an error, serve
says so in one line and exits 1.

With --api-port, an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
/v1/models, /health, /metrics) runs on the same host, and the next line on stdout is
`pdtop serve: api on http://HOST:PORT/v1`. Its requests go through the same scheduler as
the workload's. With a token (--token or $PDTOP_TOKEN), /v1/* needs `Authorization: Bearer
TOKEN`. Browser pages are refused there too unless --allow-origin allows them, and on a
loopback host a request must name it (Host: localhost or 127.0.0.1), against DNS rebinding.
On a sim: device no model runs: completions carry empty text (its placeholder tokens are
control tokens), with their real timing and token counts in `usage`. A connection must send
its request headers within 10 s and 16 KiB and its body within 30 s (else 408 or 431), one
address holds at most 1024 connections, and a text prompt too long for the context is
refused before tokenizing. After 5 wrong tokens from one address (on either port), it must
wait before its next is checked: 1 s, then twice as long each time, at most a minute.
--workload none leaves only API and injected requests. Requests past the waiting-queue
caps (--max-waiting-requests, --max-waiting-tokens) are refused: the API answers 503.

Examples:
  pdtop serve --device sim:H100 --rate 8
  pdtop serve --device sim:H100 --speed 0.1
  pdtop serve --device cpu --record run.ndjson.gz
  pdtop serve --device cpu --api-port 8000 --workload none
  pdtop serve --host 0.0.0.0 --token "$(openssl rand -hex 16)"
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from pdtop.commands.common import (
    DEVICE_HELP,
    INPUT_ERRORS,
    add_level_rule_arguments,
    add_runtime_arguments,
    cuda_missing,
    engine_link,
    fail,
    runtime_options,
    with_level_rule,
)
from pdtop.engine.errors import DeviceError
from pdtop.engine.scheduling.admission import MAX_WAITING_REQUESTS, MAX_WAITING_TOKENS
from pdtop.engine.scheduling.policies import DEFAULT_POLICY, DISAGG_ON_CUDA, POLICIES
from pdtop.engine.scheduling.workload import DEMO

SCENARIOS_HELP = "\n".join(f"  {kind}: {spec.describe()}" for kind, spec in DEMO.items())
__doc__ = __doc__.replace("{scenarios}", SCENARIOS_HELP)
RATE_HELP = "Poisson arrivals per second on top of the default workload (default 0)"
SPEED_HELP = ("sim: devices only: simulated seconds per wall second (default 1; 0.1 runs ten times slower, "
              "to watch a prefill advance layer by layer)")

if TYPE_CHECKING:
    from pdtop.engine.engine import Engine
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--device", default="auto", metavar="DEV", help=DEVICE_HELP)
    parser.add_argument("--model", metavar="PATH|synthetic:NAME",
                        help="a GGUF file or a synthetic model (synthetic:qwen3-8b, synthetic:llama3.1-8b); "
                             "default: SmolLM2-135M (sim devices: synthetic:qwen3-8b)")
    parser.add_argument("--config", metavar="FILE",
                        help="SGLang-compatible pdmux YAML (sm_group_num, manual_divisions, ...)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES,
                        help=f"scheduling policy (default {DEFAULT_POLICY})")
    parser.add_argument("--rate", type=float, metavar="REQ_PER_S", help=RATE_HELP)
    parser.add_argument("--speed", type=float, metavar="X", help=SPEED_HELP)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind (default 8765; 0 picks a free one)")
    parser.add_argument("--record", metavar="FILE",
                        help="also record every event to FILE (NDJSON; gzip if it ends in .gz)")
    parser.add_argument("--token", default=os.environ.get("PDTOP_TOKEN") or None,
                        help="secret a client needs to send control messages (default: $PDTOP_TOKEN; "
                        "the environment keeps it out of `ps`)")
    add_runtime_arguments(parser)
    add_level_rule_arguments(parser)
    parser.add_argument("--api-port", type=int, metavar="PORT",
                        help="also serve the OpenAI-compatible HTTP API and /metrics on PORT (0 picks a free one)")
    parser.add_argument("--workload", choices=("synthetic", "none"), default="synthetic",
                        help="synthetic: the default workload above (default); none: only API and injected requests")
    parser.add_argument("--max-waiting-requests", type=int, default=MAX_WAITING_REQUESTS, metavar="N",
                        help=f"requests that may wait for prefill; more are refused (default {MAX_WAITING_REQUESTS})")
    parser.add_argument("--max-waiting-tokens", type=int, default=MAX_WAITING_TOKENS, metavar="N",
                        help=f"prompt tokens the waiting requests may hold (default {MAX_WAITING_TOKENS})")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin allowed to connect, e.g. http://localhost:3000 (repeatable; "
                             "default none: pages on other sites cannot reach the server)")
    parser.add_argument("--record-dir", metavar="DIR",
                        help="where clients may start recordings (default: the working directory)")
    parser.add_argument("--max-clients", type=int, default=64, metavar="N",
                        help="connections served at once (default 64)")
    parser.add_argument("--progress", action="store_true", default=sys.stderr.isatty(),
                        help="say on stderr which device was picked and why and which model loads "
                             "(default: when stderr is a terminal; `pdtop dashboard` shows these lines)")


def check_inputs(args: argparse.Namespace) -> PdmuxConfig:
    """The pdmux config, once the device (for cuda: that the GPU is there), --dtype, --speed and the --config
    file are checked the way `serve` checks them (EngineError or OSError naming the problem). Cheap,
    and without torch for `auto`, so the dashboard calls it before its UI starts; the model is
    checked when the engine is built."""
    from pdtop.engine.build import check_dtype, parse_device

    device = args.device or "auto"
    kind = "auto" if device == "auto" else parse_device(device).kind  # auto picks cuda or cpu, never sim
    check_dtype(kind, getattr(args, "dtype", None))
    speed = getattr(args, "speed", None)
    if speed is not None:
        if kind != "sim":
            raise DeviceError(f"--speed applies to simulated devices (sim:GPU) only, not {device}")
        if not 0 < speed <= 1000:
            raise DeviceError(f"--speed must be in (0, 1000], got {speed:g}")
    missing = cuda_missing(device) if kind == "cuda" else None
    if missing:  # no GPU, or a torch without CUDA: one line before anything starts
        raise DeviceError(missing)
    if getattr(args, "link", None):
        engine_link(args.link)  # FieldError naming it
    if getattr(args, "policy", None) == "disagg" and kind == "cuda":
        raise DeviceError(DISAGG_ON_CUDA)
    return with_level_rule(_load_config(args.config), args)


def run(args: argparse.Namespace) -> int:
    from pdtop.engine.scheduling.workload import demo_workload
    from pdtop.telemetry.server.server import is_loopback

    if not 0 <= args.port <= 65535:
        return fail("serve", f"--port must be 0..65535, got {args.port}")
    if args.api_port is not None and not 0 <= args.api_port <= 65535:
        return fail("serve", f"--api-port must be 0..65535, got {args.api_port}")
    if args.workload == "none" and args.rate is not None:
        return fail("serve", "--rate sets the synthetic workload's arrivals; it does not go with --workload none")
    for flag in ("max_waiting_requests", "max_waiting_tokens"):
        if getattr(args, flag) < 1:
            return fail("serve", f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.rate is not None and not 0 <= args.rate <= 1000:
        return fail("serve", f"--rate must be 0..1000 requests/s, got {args.rate:g}")
    if args.token is not None and not args.token:
        return fail("serve", "--token must not be empty")
    if not is_loopback(args.host) and not args.token:
        return fail("serve", f"binding {args.host} (not a loopback address) needs --token")
    if args.max_clients < 1:
        return fail("serve", f"--max-clients must be at least 1, got {args.max_clients}")
    if args.api_port is not None and args.api_port == args.port != 0:
        return fail("serve", f"--api-port must differ from --port (both {args.port})")
    busy = _port_in_use(args.host, [p for p in (args.port, args.api_port) if p])
    if busy:  # before the model loads (seconds on cpu), not after
        return fail("serve", busy)
    try:
        config = check_inputs(args)
        from pdtop.commands import _startup
        from pdtop.engine.build import build_engine, parse_device
        from pdtop.engine.scheduling.admission import QueueLimits

        started = time.monotonic()
        if args.progress:
            _startup.say(_startup.device_choice(args.device))
            _startup.say(_startup.model_loading(args.model, args.device))
        workload = None if args.workload == "none" else demo_workload(parse_device(args.device).kind, args.rate)
        engine = build_engine(device=args.device, model=args.model, config=config, policy=args.policy,
                              workload=workload, limits=QueueLimits(args.max_waiting_requests,
                                                                    args.max_waiting_tokens),
                              **runtime_options(args))
    except INPUT_ERRORS as exc:
        return fail("serve", exc)
    for line in runtime_lines(engine.describe().runtime or {}):
        print(f"pdtop serve: {line}", file=sys.stderr, flush=True)
    if args.progress:  # the last start-up line: `pdtop dashboard` shows those before it
        _startup.say(_startup.ready(engine, started))
    # The event loop answers clients while the engine thread computes; Python hands the GIL to a
    # waiting thread every switch interval, so 1 ms (default 5) lets the loop in sooner. Measured
    # (bench/soak.py's probe, sim:H100 at 50 req/s, 600 slowloris sockets): /health p99 109 -> 48 ms.
    sys.setswitchinterval(0.001)
    # Before the ports open, not in the engine thread's start (`Engine.run` freezes again, by then a
    # small heap): the first full collection over start-up's objects stalled every thread for 166 ms
    # under load, which was the soak's worst /health in its first 10 s.
    from pdtop.engine.runtime.heap import freeze_startup_heap

    freeze_startup_heap()
    try:
        return asyncio.run(_serve(engine, args))
    finally:
        engine.close()


def runtime_lines(runtime: dict) -> list[str]:
    """What the engine runs, for stderr before the ports open: the weights path (`weights gguf Q4_1+Q8_0
    (avx2)`), the KV size chosen (on cuda, from free memory) and the decode graphs' pool."""
    lines = [f"weights {runtime['weights']}" if runtime.get("weights") else None,
             (runtime.get("kv_cache") or {}).get("line"), (runtime.get("cuda_graphs") or {}).get("line")]
    return [line for line in lines if line]


def _port_in_use(host: str, ports: list[int]) -> str | None:
    """Why one of `ports` cannot be bound on `host` now, in the words the real bind would use; None if all can.
    The servers bind again later (and say so if that fails): this only answers before a slow start."""
    import socket

    for port in ports:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers: TIME_WAIT is no use
                sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def _load_config(path: str | None) -> PdmuxConfig:
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config

    return load_pdmux_config(path) if path else PdmuxConfig()


async def _serve(engine: Engine, args: argparse.Namespace) -> int:
    from pdtop.telemetry.hardware.hw import HwSampler
    from pdtop.telemetry.recording.recorder import RecordingError
    from pdtop.telemetry.server.server import TelemetryServer
    from pdtop.token_gate import GuessBudget

    guesses = GuessBudget()  # wrong tokens count the same on both ports
    try:
        server = TelemetryServer(engine, args.host, args.port, token=args.token, allow_origins=args.allow_origin,
                                 record_dir=args.record_dir, max_clients=args.max_clients, guesses=guesses)
    except ValueError as exc:
        return fail("serve", exc)
    api = None
    try:
        await server.start()
        if args.record:
            server.start_recording(args.record, confined=False)
    except OSError as exc:
        await server.stop()
        return fail("serve", f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    except RecordingError as exc:
        await server.stop()
        return fail("serve", str(exc))
    if args.api_port is not None:
        from pdtop.api.server import ApiServer

        try:
            api = ApiServer(engine, args.host, args.api_port, token=args.token, allow_origins=args.allow_origin,
                            guesses=guesses)
            await api.start()
        except INPUT_ERRORS as exc:
            await server.stop()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            return fail("serve", f"cannot serve the API on {args.host}:{args.api_port}: {reason}")
        server.api_url = api.url
    print(f"pdtop serve: listening on {server.url}", flush=True)
    if api is not None:
        print(f"pdtop serve: api on {api.url}", flush=True)
    if args.record:
        print(f"pdtop serve: recording to {args.record}", file=sys.stderr, flush=True)

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    stop = threading.Event()
    failure: list[BaseException] = []

    def engine_loop() -> None:
        try:
            engine.run(stop, realtime=True, speed=getattr(args, "speed", None) or 1.0)
        except BaseException as exc:  # report it, and stop serving
            failure.append(exc)
            loop.call_soon_threadsafe(done.set)

    thread = threading.Thread(target=engine_loop, name="pdtop-engine", daemon=True)
    dev = engine.describe().device.extra  # a cuda device's own facts
    match = {k: dev[k] for k in ("uuid", "pci_bus_id") if dev.get(k)}  # the engine's GPU, found in NVML
    sampler = HwSampler(server.publish, gpu_match=match or None).start()
    thread.start()
    try:
        await done.wait()
    finally:
        stop.set()
        sampler.stop()
        await asyncio.to_thread(thread.join, 10)
        if api is not None:
            await api.stop()
        await server.stop()
    if failure:
        return fail("serve", f"the engine stopped: {type(failure[0]).__name__}: {failure[0]}", code=1)
    print("pdtop serve: stopped", file=sys.stderr)
    return 0
