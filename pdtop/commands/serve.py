"""Run the engine with its workload and serve telemetry and control over a websocket.

The engine runs rounds on its own thread (a sim: device is paced to wall time); every
round, request and config change is streamed to each connected client as JSON (see
docs/protocol.md), with a hardware sample about once a second. Clients send control
messages (pin a level, change knobs, inject a long prompt) on the same connection.

The first line on stdout is `pdtop serve: listening on ws://HOST:PORT` (with --port 0
the port is picked for you). Binding anything but a loopback address needs --token;
with a token set, clients without it (`ws://HOST:PORT/?token=...` or a first message
{"cmd": "auth", "token": ...}) may watch but not control. Ctrl-C stops cleanly.

Examples:
  pdtop serve --device sim:H100 --rate 8
  pdtop serve --device cpu --record run.ndjson.gz
  pdtop serve --host 0.0.0.0 --token "$(openssl rand -hex 16)"
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from pdtop.commands._common import DEVICE_HELP, INPUT_ERRORS, add_runtime_arguments, fail, runtime_options
from pdtop.engine.scheduling.policies import DEFAULT_POLICY, POLICIES

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
    parser.add_argument("--rate", type=float, metavar="REQ_PER_S",
                        help="Poisson arrival rate of the workload (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind (default 8765; 0 picks a free one)")
    parser.add_argument("--record", metavar="FILE",
                        help="also record every event to FILE (NDJSON; gzip if it ends in .gz)")
    parser.add_argument("--token", default=os.environ.get("PDTOP_TOKEN") or None,
                        help="secret a client needs to send control messages (default: $PDTOP_TOKEN; "
                        "the environment keeps it out of `ps`)")
    add_runtime_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pdtop.engine.scheduling.workload import WorkloadSpec
    from pdtop.telemetry.server.server import is_loopback

    if not 0 <= args.port <= 65535:
        return fail("serve", f"--port must be 0..65535, got {args.port}")
    if args.rate is not None and not 0 <= args.rate <= 1000:
        return fail("serve", f"--rate must be 0..1000 requests/s, got {args.rate:g}")
    if args.token is not None and not args.token:
        return fail("serve", "--token must not be empty")
    if not is_loopback(args.host) and not args.token:
        return fail("serve", f"binding {args.host} (not a loopback address) needs --token")
    try:
        config = _load_config(args.config)
        from pdtop.engine.build import build_engine

        workload = WorkloadSpec() if args.rate is None else WorkloadSpec(rate=args.rate)
        engine = build_engine(device=args.device, model=args.model, config=config, policy=args.policy,
                              workload=workload, **runtime_options(args))
    except INPUT_ERRORS as exc:
        return fail("serve", exc)
    runtime = engine.describe()["runtime"]
    for line in (runtime["kv_cache"].get("line"), runtime.get("cuda_graphs", {}).get("line")):
        if line:  # the KV size chosen (on cuda, from free memory), the decode graphs' pool
            print(f"pdtop serve: {line}", file=sys.stderr, flush=True)
    try:
        return asyncio.run(_serve(engine, args))
    finally:
        engine.close()


def _load_config(path: str | None) -> PdmuxConfig:
    from pdtop.engine.scheduling.pdmux_config import PdmuxConfig, load_pdmux_config

    return load_pdmux_config(path) if path else PdmuxConfig()


async def _serve(engine: Engine, args: argparse.Namespace) -> int:
    from pdtop.telemetry.hardware.hw import HwSampler
    from pdtop.telemetry.recording.recorder import RecordingError
    from pdtop.telemetry.server.server import TelemetryServer

    server = TelemetryServer(engine, args.host, args.port, token=args.token)
    try:
        await server.start()
        if args.record:
            server.start_recording(args.record)
    except OSError as exc:
        await server.stop()
        return fail("serve", f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    except RecordingError as exc:
        await server.stop()
        return fail("serve", str(exc))
    print(f"pdtop serve: listening on {server.url}", flush=True)
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
            engine.run(stop, realtime=True)
        except BaseException as exc:  # report it, and stop serving
            failure.append(exc)
            loop.call_soon_threadsafe(done.set)

    thread = threading.Thread(target=engine_loop, name="pdtop-engine", daemon=True)
    dev = engine.describe()["device"]
    match = {k: dev[k] for k in ("uuid", "pci_bus_id") if dev.get(k)}  # the engine's GPU, found in NVML
    sampler = HwSampler(server.publish, gpu_match=match or None).start()
    thread.start()
    try:
        await done.wait()
    finally:
        stop.set()
        sampler.stop()
        await asyncio.to_thread(thread.join, 10)
        await server.stop()
    if failure:
        print(f"pdtop serve: engine stopped: {type(failure[0]).__name__}: {failure[0]}", file=sys.stderr)
        return 1
    print("pdtop serve: stopped", file=sys.stderr)
    return 0
